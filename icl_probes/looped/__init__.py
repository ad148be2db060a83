"""Ch. 8 of Z. Shi (2024): a looped linear transformer does multi-step gradient descent in context.

- ``model``: the masked linear attention, the loop, the construction of Q and P, the task sampler.
- ``fig81``: Experiment A, Fig. 8.1 (the construction against the Thm 8.16 bound).
- ``train``: Experiment B, beyond the paper (Q, P and the step sizes learned by gradient descent).
- ``cli``: ``python -m icl_probes.looped {fig81,train,check} --help``.

Importing this package runs nothing.
"""
