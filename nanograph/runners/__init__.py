"""Typed runners, one per execution path (decode, prefill, verify, draft, draft-extend), each
on any graph backend; the only layer that knows graph backends exist."""
