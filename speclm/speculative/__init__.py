"""Speculative decoding: proposers (n-gram, draft model / layer skip, Medusa, EAGLE), their factory and
the speculation-length controller. Verification lives in speclm.sample.rejection."""

from speclm.speculative.controller import SpeculationController
from speclm.speculative.draft_model import DraftModelProposer
from speclm.speculative.eagle import EagleProposer
from speclm.speculative.factory import ProposerFactory
from speclm.speculative.medusa import MedusaProposer
from speclm.speculative.ngram import NgramProposer
from speclm.speculative.proposer import Proposal, Proposer

__all__ = [
    "DraftModelProposer",
    "EagleProposer",
    "MedusaProposer",
    "NgramProposer",
    "Proposal",
    "Proposer",
    "ProposerFactory",
    "SpeculationController",
]
