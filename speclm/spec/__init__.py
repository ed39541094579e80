"""Speculative decoding: proposers and the speculation-length controller."""
from speclm.spec.adaptive import SpeculationController
from speclm.spec.draft_model import DraftModelProposer
from speclm.spec.ngram import NgramProposer
from speclm.spec.proposer import Proposal, Proposer

__all__ = ["DraftModelProposer", "NgramProposer", "Proposal", "Proposer", "SpeculationController"]
