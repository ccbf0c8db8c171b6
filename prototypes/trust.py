"""Whether a chosen method may be installed: the signals the kernel has, and the threshold.

A mission chooses the group of drafts with the best agreement × examples passed
(``prototypes.examples.choose``). Choosing well is not enough: the default 1.5B's drafts cap
any choice at pass@6 0.6–0.8, and an installed method that is wrong answers silently from
then on. So the choice is scored again, with every signal the system has without an oracle,
and installed only above a threshold; below it the mission refuses and says why and what
would help (an example of input and output, a clearer intent, a stronger author model).

Signals (``Evidence``):

- agreement: how many independent drafts behave the same on the call and every example,
  against how many were drawn (less those a user's example refuted, and a tool's drafts the
  host's policy refused: neither says the group is wrong);
- the examples: how many of the author's own input → output examples the group passes;
- the reviewer (Coder-Reviewer reranking, Zhang et al., ICML 2023): the author model's
  log-likelihood of the intent given the code, p(intent | code), per token, set against the
  same likelihood given only the method's signature (what the body adds), together with
  p(code | intent) per token. Only backends that report log-probabilities give it (the
  embedded llama.cpp engine does); without it the decision rests on the others.

``assess`` turns the evidence into a ``Verdict``. The rule and its numbers were chosen on
the bench's older intent sets (``bench/jit.py``), never on the sets that report its
precision; ``jit_trust`` = ``off`` installs whatever the mission chose, as before.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from batos.errors import MissionFailed


@dataclass(frozen=True)
class Review:
    """The reviewer's log-likelihoods, mean natural log-probability per token."""

    intent_given_code: float
    intent_given_signature: float
    code_given_intent: float

    @property
    def gain(self) -> float:
        """How much likelier the intent is after reading the body than the signature alone."""
        return self.intent_given_code - self.intent_given_signature


@dataclass(frozen=True)
class Evidence:
    """What is known about the chosen group when the mission is about to install it."""

    support: int
    drafts: int
    examples: int
    failed: int
    groups: int
    review: Review | None = None
    #: Drafts a user's example proved wrong (they no longer count against agreement), and
    #: how many examples the user gave.
    refuted: int = 0
    asked: int = 0
    #: Drafts of a tool method whose request the host's policy refused (a host not in
    #: tools_allow, a secret not listed for it). The policy is the host's rule, fed back to
    #: the author; it says nothing about whether a draft reads the intent right, so these
    #: drafts do not stand, for or against the group.
    policy_refused: int = 0

    @property
    def standing(self) -> int:
        """The drafts that count: those drawn, less the refuted and the policy-refused."""
        return self.drafts - self.refuted - self.policy_refused

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        if self.review is not None:
            data["review"] = {**asdict(self.review), "gain": round(self.review.gain, 4)}
        return data


@dataclass
class Verdict:
    trusted: bool
    score: float
    evidence: Evidence
    reasons: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "trusted": self.trusted,
            "score": round(self.score, 4),
            "reasons": list(self.reasons),
            **self.evidence.as_dict(),
        }


class MethodUntrusted(MissionFailed):
    """Drafts were written and gated, but none can be trusted enough to install."""


def score(evidence: Evidence) -> float:
    """One number in [0, 1]: the share of drafts behind the group, times the share of the
    examples it passes, times the reviewer's support when there is a review (a logistic of
    the intent's gain from reading the body; 0.5 at no gain)."""
    share = evidence.support / max(evidence.standing, 1)
    examples_share = (
        (evidence.examples - evidence.failed) / evidence.examples if evidence.examples else 0.5
    )
    value = share * examples_share
    if evidence.review is not None:
        value *= 1.0 / (1.0 + math.exp(-REVIEW_SLOPE * evidence.review.gain))
    return value


#: How steeply the reviewer's gain moves the score (per nat per token).
REVIEW_SLOPE = 4.0


def threshold() -> float | None:
    """The ``jit_trust`` setting: the score to reach, or None when it is 'off'."""
    from batos import settings

    text = settings.get_str("jit_trust")
    return None if text == "off" else float(text)


def assess(evidence: Evidence, threshold: float | None) -> Verdict:
    """The verdict at ``threshold`` (None: every chosen group is installed, as before)."""
    value = score(evidence)
    if threshold is None or value >= threshold:
        return Verdict(True, value, evidence)
    reasons = []
    standing = evidence.standing
    if evidence.support < 2:
        reasons.append(
            f"no two of the {standing} drafts agree on what the method does"
            if standing > 1
            else "only one draft is left standing"
        )
    elif evidence.support < standing:
        reasons.append(f"only {evidence.support} of {standing} drafts agree on what it does")
    if evidence.failed:
        reasons.append(
            f"the chosen draft fails {evidence.failed} of its {evidence.examples} examples"
        )
    elif not evidence.examples:
        reasons.append("no examples could be written to check the drafts against")
    if evidence.review is not None and evidence.review.gain <= 0:
        reasons.append("read back, the code does not make the intent any likelier")
    if not reasons:
        reasons.append(f"its trust score {value:.2f} is under the threshold {threshold:.2f}")
    return Verdict(False, value, evidence, reasons)


def refusal(receiver: Any, selector: str, verdict: Verdict) -> MethodUntrusted:
    """The error a refused mission ends with: why, and what would help."""
    return MethodUntrusted(
        f"{receiver!r} does not understand {selector!r}, and the method written for it is "
        f"not trusted enough to install (score {verdict.score:.2f}); the image is unchanged",
        verdict.reasons,
        hint="make the intent more precise (the object's 'intents' slot), give one example "
        "of input and expected output when asked, let a stronger coder model write methods, "
        "or lower BATOS_JIT_TRUST",
    )
