"""Consistent rollout (DORA, arXiv 2604.26256): APRIL whose partials finish on the policy that began them.

APRIL resumes a buffered partial on the newest weights: its prompt and partial response are
prefilled again by the new policy and its later tokens come from it, so one trajectory mixes
versions.  Here every request names the version its sample started on
(``GenerateRequest.policy_version``): a partial begun on version v finishes on v, while fresh
samples start on the current version.  The engine keeps v's weights for as long as a buffered
partial needs them (the loop passes the versions at every step end) and v's KV for the partial, so
nothing is prefilled again.  Everything else - N', abort at N, FIFO resume, the caps - is APRIL's.

What it trades: every trained response is on one version (version span 0; its tokens are still
as old as its start, so the off-policy share is APRIL's or higher), for memory (a weight copy per
old version still live) and, while two versions decode together, one forward pass per version per
decode step.  It needs an engine that holds several versions (``sim``, ``hf``, ``fake``); vLLM
and SGLang hold one set of weights per engine and are refused up front.
"""

from __future__ import annotations

from dataclasses import dataclass

from april_impl.april import AprilStrategy

__all__ = ["ConsistentStrategy"]


class ConsistentStrategy(AprilStrategy):
    """APRIL with every request pinned to the policy version its sample started on."""

    @dataclass(kw_only=True, slots=True, frozen=True)
    class Config(AprilStrategy.Config):
        pass

    name = "consistent"
    pins_versions = True
