"""Speculative decoding: drafters (n-gram prompt lookup, a draft model) and verification.

A drafter proposes up to k tokens per request; the target model scores the request's last
token and the drafts in one forward (k+1 rows), and verification keeps the longest prefix the
target agrees with plus one token of its own. The engine orchestrates the step
(``nanograph/engine/speculative.py``); the typed runners capture its forwards.
"""
