"""Synthetic ScaleCUA-format corpora: realistic screens, coherent tasks, the published layout.

Command line::

    python -m data_gen make-sample --out CORPUS --trajectories 60 --seed 0
"""

from data_gen.sample_corpus.writer import (
    GeneratedEpisode,
    SampleConfig,
    SampleCorpus,
    make_sample,
)

__all__ = ["GeneratedEpisode", "SampleConfig", "SampleCorpus", "make_sample"]
