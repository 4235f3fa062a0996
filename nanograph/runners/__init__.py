"""Runners: one per execution path (decode, prefill), each on any graph backend."""
