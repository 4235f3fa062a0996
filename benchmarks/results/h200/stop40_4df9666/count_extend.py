"""bench spec's draft:4 arm at batch 1 with the draft-extend replays counted per shape (stop
40, call 9): ``python3 count_extend.py OUT.json NAME`` from a tree's root."""

import collections
import sys

from nanograph.bench import spec
from nanograph.runners.verify_runner import DraftExtendRunner

counts = collections.Counter()
original = DraftExtendRunner.replay


def replay(self, shape, batch, in_flight):
    counts[str(shape)] += 1
    return original(self, shape, batch, in_flight)


DraftExtendRunner.replay = replay
args = "--arms draft:4 --batches 1 --repeats 3 --new-tokens 96 --out".split()
spec.main([*args, sys.argv[1]])
print(sys.argv[2], "draft_extend replays by shape:", dict(counts))
