"""Speculative decoding: proposers, token trees and the speculation-length controller."""
from speclm.spec.adaptive import SpeculationController
from speclm.spec.draft_model import DraftModelProposer
from speclm.spec.eagle import EagleProposer
from speclm.spec.medusa import MedusaProposer
from speclm.spec.ngram import NgramProposer
from speclm.spec.proposer import Proposal, Proposer
from speclm.spec.tree import TokenTree

__all__ = ["DraftModelProposer", "EagleProposer", "MedusaProposer", "NgramProposer", "Proposal", "Proposer",
           "SpeculationController", "TokenTree"]
