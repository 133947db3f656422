"""The serving half of ``make demo`` (``python -m serve.demo``): a guarded agent episode against
the gateway on the demo's checkpoint, its diagnosis, and the pages that link the whole run."""
