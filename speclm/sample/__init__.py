"""Token selection: plain sampling and speculative verification."""

from speclm.sample.rejection import RejectionSampler, VerificationResult
from speclm.sample.sampler import processed_probs, sample_from_probs

__all__ = ["RejectionSampler", "VerificationResult", "processed_probs", "sample_from_probs"]
