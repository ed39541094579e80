"""Structured outputs and tool calls: constraints compiled from requests, per-sequence grammar matchers
(llguidance), tools in prompts and grammars, tool calls parsed from replies."""

from speclm.structured.grammar import Constraint, ConstraintError, compile_constraint, constraint_from_response_format
from speclm.structured.matcher import GrammarMatcher, GrammarVocab

__all__ = [
    "Constraint",
    "ConstraintError",
    "GrammarMatcher",
    "GrammarVocab",
    "compile_constraint",
    "constraint_from_response_format",
]
