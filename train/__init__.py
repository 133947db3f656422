"""hivig stage package: train (the SFT recipe is ``train.sft``; ``python -m train`` runs it)."""

from train.config import TrainConfig
