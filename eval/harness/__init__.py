"""lm-evaluation-harness adapter: run any harness task with any registered gemfilter method.

``adapter`` registers the model class ``gemfilter`` with the harness; ``cli`` is ``gemfilter-lm-eval``, the
harness's own command line with that class registered.
"""
