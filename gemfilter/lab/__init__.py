"""The lab around the plugin: command lines, benchmarks, inspection, serving and safe result files.

The plugin's core (``gemfilter.apply``, ``attention``, ``banded``, ``methods``, ``selection``, ``score``,
``models``, ``compat``, ``layers``, ``conversation``, ``measure``, ``extras``) imports nothing from here;
these modules use it: ``cli`` and ``options`` (command lines), ``entry`` (every command's error and
Ctrl-C handling), ``io`` (result files), ``haystack`` (NIAH's context), ``bench``, ``inspection`` and
``serve``. ``tests/test_layering.py`` enforces the direction.
"""
