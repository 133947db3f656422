"""hivig: a history-aware, visually grounded critic for computer-use agents.

The core library shared by the three stages (``data_gen``, ``train``, ``serve``): actions and
their parsers, the error taxonomy, canonical frames and markers, prompts and output contracts,
sample records, model adapters and inference backends.
"""

__version__ = "0.1.0"
