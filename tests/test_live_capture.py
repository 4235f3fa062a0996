"""Serve while capturing, on CPU: the ladder planner, the budget's LRU bookkeeping, the shape
state machine, and the live runners end to end with the ``eager`` graph backend standing in for
CUDA graphs (its "graph" replays by calling the captured forward), so every dispatch, lease,
eviction and fallback path runs through the real model against the plain eager engine.
"""

from __future__ import annotations

import itertools
import threading
import time

import pytest
import torch

from nanograph import SamplingParams
from nanograph.cli import build_parser, engine_config_from
from nanograph.engine.config import EngineConfig, parse_graph_memory
from nanograph.graph import GraphCaptureError, get_backend
from nanograph.runners.decode_runner import DecodeRunner
from nanograph.runners.graph_budget import GraphBudget
from nanograph.runners.ladder import DECODE_PAD_COST, LadderCosts, plan_ladder
from nanograph.runners.live_capture import LiveCapture
from nanograph.runners.prefill_runner import PrefillRunner
from nanograph.runners.shape_states import ShapeState, ShapeStates
from nanograph.runners.shapes import ShapeKey, decode_shapes, prefill_shapes
from tests.conftest import make_llm

CPU = torch.device("cpu")
DECODE_LADDER = [1, 2, 4, 8, 16, 24, 32, 64, 128, 256]


# ---- ladder planner ---------------------------------------------------------------------------
def test_planner_covers_what_was_seen_and_nothing_above():
    costs = LadderCosts(pad_cost=DECODE_PAD_COST, bytes_per_token=1e6, shape_bytes=1e5)
    ladder = plan_ladder({1: 100, 3: 50, 16: 10}, DECODE_LADDER, costs)
    assert ladder == [1, 4, 16]  # 3 pads to 4; nothing above the largest size seen
    assert plan_ladder({}, DECODE_LADDER, costs) == []


def test_planner_respects_shape_count_and_budget():
    costs = LadderCosts(pad_cost=DECODE_PAD_COST, bytes_per_token=1000.0)
    histogram = {1: 100, 3: 50, 16: 10}
    assert plan_ladder(histogram, DECODE_LADDER, costs, max_shapes=1) == [16]
    # a ceiling of 10 tokens fits: 16 runs eagerly, and bucket 8 would serve nothing
    assert plan_ladder(histogram, DECODE_LADDER, costs, budget=10_000) == [1, 4]
    assert plan_ladder(histogram, DECODE_LADDER, costs, budget=500) == []


def test_planner_applies_the_prefill_padding_rule():
    costs = LadderCosts(pad_cost=1 / 256, max_padding_ratio=2.0)
    assert plan_ladder({100: 10}, [64, 256], costs) == []  # 256 > 2 x 100: eager anyway
    assert plan_ladder({100: 10}, [64, 128, 256], costs) == [128]


def test_planner_trades_padding_against_launch_overhead():
    # 10 batches of 1 token padded to 1000 cost 10 x 999 / 256 > 10 eager forwards: own bucket
    costs = LadderCosts(pad_cost=1 / 256)
    assert plan_ladder({1: 10, 1000: 10}, [1, 1000], costs) == [1, 1000]
    # padding 1 -> 2 costs 1/256 of an eager forward: one bucket is enough under max_shapes=1
    assert plan_ladder({1: 10, 2: 10}, [1, 2], costs, max_shapes=1) == [2]


def test_planner_prices_graph_memory():
    # a prefill pool of ~1.5 GiB at 8192 tokens: a size seen once in 1,000 forwards does not
    # pay for it (it saves 0.1% of the launches), one seen in half of them does
    costs = LadderCosts(pad_cost=1 / 256, bytes_per_token=200_000.0, max_padding_ratio=2.0)
    buckets = [16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192]
    assert plan_ladder({16: 999, 8192: 1}, buckets, costs) == [16]
    assert plan_ladder({16: 500, 8192: 500}, buckets, costs) == [16, 8192]


def test_planner_leaves_long_prefills_eager():
    """A forward whose GPU work outlasts its launches gains nothing from a graph: long prompts
    get no bucket (no pool held for them), short ones still do."""
    costs = LadderCosts(pad_cost=1 / 256, bytes_per_token=50_000.0, max_padding_ratio=2.0,
                        eager_bound_tokens=2048)  # fmt: skip
    buckets = [16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192]
    assert costs.eager_saving(1024) == 0.5 and costs.eager_saving(4096) == 0.0
    assert plan_ladder({3728: 40, 4288: 40}, buckets, costs) == []
    assert plan_ladder({64: 40, 3728: 40, 4288: 40}, buckets, costs) == [64]


def _brute_force(histogram, candidates, costs, budget, max_shapes):
    def cost(ladder):
        total = 0.0
        for n, c in histogram.items():
            b = next((b for b in ladder if b >= n), None)
            too_padded = (
                b is not None and costs.max_padding_ratio and b > costs.max_padding_ratio * n
            )
            eager = b is None or too_padded
            total += c * (costs.eager_saving(n) if eager else costs.pad_cost * (b - n))
        return total

    best_cost = cost([])
    for k in range(1, max_shapes + 1):
        for ladder in itertools.combinations(candidates, k):
            if budget is not None and costs.memory(ladder[-1], k) > budget:
                continue
            if cost(ladder) < best_cost - 1e-9:
                best_cost = cost(ladder)
    return best_cost, cost


@pytest.mark.parametrize("seed", range(12))
def test_planner_is_optimal_against_exhaustive_search(seed):
    g = torch.Generator().manual_seed(seed)
    candidates = [1, 2, 4, 8, 16, 24, 32, 48]
    sizes = torch.randint(1, 49, (6,), generator=g).tolist()
    histogram = {n: int(c) for n, c in zip(sizes, torch.randint(1, 50, (6,), generator=g))}
    costs = LadderCosts(
        pad_cost=[1 / 1024, 1 / 16, 1 / 4][seed % 3], bytes_per_token=100.0, shape_bytes=50.0,
        max_padding_ratio=2.0 if seed % 2 else None,
        eager_bound_tokens=[None, 40.0, 20.0, 64.0][seed % 4],
    )  # fmt: skip
    budget, max_shapes = [None, 2500, 1000][seed % 3], 1 + seed % 4
    best_cost, cost = _brute_force(histogram, candidates, costs, budget, max_shapes)
    ladder = plan_ladder(histogram, candidates, costs, budget, max_shapes)
    assert len(ladder) <= max_shapes
    assert budget is None or not ladder or costs.memory(ladder[-1], len(ladder)) <= budget
    assert cost(ladder) == pytest.approx(best_cost)


# ---- budget ----------------------------------------------------------------------------------
def key(path, tokens):
    return (path, ShapeKey(tokens, tokens if path == "decode" else 4))


def test_budget_evicts_least_recently_replayed_first():
    budget = GraphBudget(limit=300, bytes_per_token={"decode": 0.0}, shape_bytes=100)
    for t in (1, 2, 4):
        budget.add(key("decode", t))
    budget.touch(key("decode", 1))  # 2 is now the least recently replayed, then 4
    admission = budget.admit(key("decode", 8))
    assert admission.victims == (key("decode", 2),)
    assert not admission.rebuild  # 4 stays the decode pool's largest graph
    assert budget.admit(key("decode", 4)).victims == ()  # already captured


def test_budget_rebuilds_a_pool_whose_largest_graph_goes_and_refuses_what_never_fits():
    budget = GraphBudget(limit=1000, bytes_per_token={"decode": 10.0, "prefill": 1.0})
    budget.add(key("decode", 64))  # 640 bytes
    budget.add(key("prefill", 128))  # 128 bytes
    budget.add(key("decode", 8))
    budget.touch(key("decode", 8))
    assert budget.used == 640 + 128
    admission = budget.admit(key("prefill", 512))  # 640 + 512 > 1000
    assert admission.victims == (key("decode", 64),)
    assert admission.rebuild == {"decode"}  # the decode pool shrinks only if rebuilt
    assert budget.admit(key("decode", 128)) is None  # 1280 alone: stays eager
    budget.remove(key("decode", 64))
    assert budget.used == 80 + 128


def test_budget_calibrates_from_the_measured_pool_and_shrinks_around_the_new_shape():
    budget = GraphBudget(limit=1000, bytes_per_token={"decode": 1.0})
    budget.add(key("decode", 8))
    budget.calibrate("decode", 600)  # the first capture into a pool measures its floor
    assert budget.floor["decode"] == 600 and budget.bytes_per_token["decode"] == 1.0
    assert budget.predicted([key("decode", 4)]) == 600  # small shapes cost whole segments
    budget.add(key("decode", 16))
    budget.calibrate("decode", 1600)  # outgrew the floor: 100 bytes per token of the largest
    assert budget.bytes_per_token["decode"] == 100.0
    budget.calibrate("decode", 500)  # never lowered: predictions err on the large side
    assert budget.bytes_per_token["decode"] == 100.0 and budget.floor["decode"] == 600
    budget.add(key("decode", 4))
    excess = budget.shrink(protect=key("decode", 4))
    # 8 is least recent, but the pool's size is set by 16: evicting 8 alone would free nothing
    assert excess.victims == (key("decode", 16),)
    assert excess.rebuild == {"decode"}


# ---- shape states ----------------------------------------------------------------------------
def test_shape_state_machine():
    a, b = ShapeKey(4, 4), ShapeKey(1, 1)
    states = ShapeStates([a, b])
    assert states[a] is ShapeState.ABSENT and states.ready() == ()
    with pytest.raises(ValueError, match="absent -> ready"):
        states.publish(a)
    assert states.claim(a) and not states.claim(a)  # one capturer at a time
    states.publish(a)
    assert states.claim(b)
    states.publish(b)
    assert states.ready() == (b, a)  # sorted for dispatch
    states.evict(a)
    assert states.ready() == (b,) and states[a] is ShapeState.EVICTED
    assert states.claim(a)
    states.fail(a, GraphCaptureError("boom"))
    assert not states.claim(a) and states[a] is ShapeState.FAILED
    with pytest.raises(ValueError):
        states.evict(a)
    assert states.counts()["failed"] == 1 and states.counts()["ready"] == 1


def test_ready_set_is_never_seen_half_published_under_concurrent_capture():
    shapes = [ShapeKey(n, n) for n in range(1, 65)]
    states = ShapeStates(shapes)
    graphs: dict[ShapeKey, object] = {}
    seen_bad, done = [], threading.Event()

    def capture():
        for shape in reversed(shapes):
            assert states.claim(shape)
            graphs[shape] = object()  # the graph exists before it is published
            states.publish(shape)
        for shape in shapes[::2]:
            states.evict(shape)  # readers holding an older snapshot never see a missing graph
        done.set()

    def lookup():
        while not done.is_set():
            ready = states.ready()
            if list(ready) != sorted(ready) or any(s not in graphs for s in ready):
                seen_bad.append(ready)

    readers = [threading.Thread(target=lookup) for _ in range(2)]
    for t in readers:
        t.start()
    capture()
    for t in readers:
        t.join()
    assert not seen_bad
    assert states.ready() == tuple(shapes[1::2])


# ---- live runners end to end (eager graph backend) ----------------------------------------
class CountingBackend:
    """The eager backend; counts captures, can fail one token count, and checks that no replay
    runs while a capture of any runner is in progress (what the capture lease guarantees)."""

    name = "counting"
    capturing = threading.Event()
    overlaps: list[str] = []

    def __init__(self, fail_rows: int | None = None, capture_delay: float = 0.0) -> None:
        self.inner, self.fail_rows, self.delay = get_backend("eager"), fail_rows, capture_delay
        self.captured: list[int] = []

    def capture(self, fn, pool=None):
        CountingBackend.capturing.set()
        try:
            time.sleep(self.delay)  # widen the window a replay could fall into
            out = fn()
            if out.shape[0] == self.fail_rows:
                raise GraphCaptureError("capture failed at model.py:1: `x.item()`")
            graph, out = self.inner.capture(fn, pool)
            self.captured.append(out.shape[0])
            replay = graph.replay

            def checked_replay():
                if CountingBackend.capturing.is_set():
                    CountingBackend.overlaps.append("replay during capture")
                replay()

            graph.replay = checked_replay
            return graph, out
        finally:
            CountingBackend.capturing.clear()


@pytest.fixture(scope="module")
def llm(tiny_model_dir):
    return make_llm(tiny_model_dir("qwen3"), disable_prefix_caching=True)


GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)


def prompts(n: int = 6):
    g = torch.Generator().manual_seed(0)
    return [torch.randint(0, 256, (k,), generator=g).tolist() for k in (5, 17, 30, 9, 12, 3)[:n]]


@pytest.fixture(scope="module")
def reference(llm):
    return [o.token_ids for o in llm.generate(prompts(), GREEDY)]


def live_runners(llm, mode, ladder="default", limit=None, shape_bytes=0.0, **backend_args):
    e = llm.engine
    pages = e.kv_cache.pages_needed(e.max_model_len)
    runners = {
        path: (DecodeRunner if path == "decode" else PrefillRunner)(
            e.model,
            e.attention,
            e.kv_cache.k,
            e.kv_cache.v,
            CountingBackend(**backend_args.get(path, {})),
            shapes,
            pages,
            e.kv_cache.page_size,
            CPU,
        )  # fmt: skip
        for path, shapes in (
            ("decode", decode_shapes([1, 2, 4, 8])),
            ("prefill", prefill_shapes([16, 32, 64], slots=2)),
        )
    }
    budget = GraphBudget(limit, {"decode": 0.0, "prefill": 0.0}, shape_bytes)
    return LiveCapture(runners, mode, ladder, budget, CPU), runners


def serve(llm, live, runners, params=GREEDY):
    CountingBackend.overlaps.clear()
    llm.engine.runner.graph_runners = runners
    try:
        live.start()
        return [o.token_ids for o in llm.generate(prompts(), params)]
    finally:
        live.close()
        llm.engine.runner.graph_runners = {}


def test_no_graph_ready_means_the_eager_path_unchanged(llm, reference):
    live, runners = live_runners(llm, "background")  # the capture thread is never started
    llm.engine.runner.graph_runners = runners
    before = dict(llm.engine.runner.eager_forwards)
    try:
        out = [o.token_ids for o in llm.generate(prompts(), GREEDY)]
    finally:
        llm.engine.runner.graph_runners = {}
    assert out == reference
    assert all(r.replays == 0 and r.graphs == {} for r in runners.values())
    eager = sum(llm.engine.runner.eager_forwards.values()) - sum(before.values())
    assert eager == sum(r.fallbacks for r in runners.values()) > 0
    stats = live.stats()["paths"]
    assert sum(stats["decode"]["histogram"].values()) == runners["decode"].fallbacks


def test_lazy_capture_captures_a_bucket_the_second_time_and_keeps_tokens(llm, reference):
    live, runners = live_runners(llm, "lazy")
    assert serve(llm, live, runners) == reference
    decode = live.runners["decode"]
    wanted_twice = {s for s, n in decode.demand.items() if n >= 2}
    assert set(decode.states.ready()) == wanted_twice and wanted_twice
    assert runners["decode"].replays > 0
    assert not CountingBackend.overlaps


def test_background_capture_serves_throughout_with_identical_tokens(llm, reference):
    live, runners = live_runners(llm, "background", decode={"capture_delay": 0.02})
    llm.engine.runner.graph_runners = runners
    try:
        live.start()
        during = [o.token_ids for o in llm.generate(prompts(), GREEDY)]
        assert live.wait(timeout=120)
        after = [o.token_ids for o in llm.generate(prompts(), GREEDY)]
        pair = [o.token_ids for o in llm.generate(prompts(2), GREEDY)]  # 2 slots: a prefill graph
    finally:
        live.close()
        llm.engine.runner.graph_runners = {}
    assert during == reference and after == reference and pair == reference[:2]
    assert not CountingBackend.overlaps  # no replay ever ran while a capture was open
    for path, runner in runners.items():
        assert set(runner.graphs) == set(runner.shapes), path
        assert runner.replays > 0
    assert not live.lease.shared_buffers  # the thread ended: replays stop copying


def test_a_failed_background_capture_stays_eager_with_one_warning(llm, reference, caplog):
    live, runners = live_runners(llm, "background", prefill={"fail_rows": 32})
    with caplog.at_level("WARNING", logger="nanograph"):
        live.start()
        assert live.wait(timeout=120)
        assert serve(llm, live, runners) == reference
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "32x2" in warnings[0]
    assert live.runners["prefill"].states[ShapeKey(32, 2)] is ShapeState.FAILED
    assert ShapeKey(32, 2) not in runners["prefill"].graphs


def test_eviction_under_a_small_budget_keeps_tokens(llm):
    # requests end one after another: decode batches of 6, 5, ... 1 want buckets 8, 4, 2, 1;
    # each graph costs 1 unit and at most 2 fit, so lazy capture keeps evicting
    params = [SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True)
              for m in (4, 8, 12, 16, 20, 24)]  # fmt: skip
    reference = [o.token_ids for o in llm.generate(prompts(), params)]
    live, runners = live_runners(llm, "lazy", limit=2, shape_bytes=1.0)
    assert serve(llm, live, runners, params) == reference
    assert live.budget.evictions > 0 and live.budget.rebuilds > 0
    ready = sum(len(r.graphs) for r in runners.values())
    assert ready <= 2 and len(live.budget.captured()) == ready
    for path, runner in live.runners.items():
        evicted = runner.states.in_state(ShapeState.EVICTED)
        assert not set(evicted) & set(runners[path].graphs), path


def test_background_capture_under_a_small_budget_settles_and_keeps_tokens(llm, reference):
    # the capture thread meets the budget: victims stay evicted, survivors of a pool rebuild
    # are captured again, and the thread ends with at most two graphs live
    live, runners = live_runners(llm, "background", limit=2, shape_bytes=1.0)
    live.start()
    assert live.wait(timeout=120)
    assert serve(llm, live, runners) == reference
    assert live.budget.evictions > 0
    assert sum(len(r.graphs) for r in runners.values()) == len(live.budget.captured()) <= 2
    for runner in live.runners.values():
        assert all(runner.states[s] is ShapeState.READY for s in runner.requeued)
        assert not runner.states.in_state(ShapeState.ABSENT, ShapeState.CAPTURING)
    assert not CountingBackend.overlaps


def test_learned_ladder_captures_only_the_sizes_served(llm, reference):
    live, runners = live_runners(llm, "lazy", ladder="auto")
    decode = live.runners["decode"]
    decode.replan()  # nothing seen yet: nothing planned
    assert decode.ladder == ()
    single = [prompts(1)[0]] * 3
    llm.engine.runner.graph_runners = runners
    try:
        for _ in range(3):
            llm.generate([single[0]], GREEDY)
            decode._planned_at = float("-inf")  # plan again at the next batch
    finally:
        llm.engine.runner.graph_runners = {}
    assert decode.ladder == (ShapeKey(1, 1),)  # batch size 1 only
    assert set(runners["decode"].graphs) == {ShapeKey(1, 1)}
    assert decode.stats()["histogram"] == {1: sum(decode.histogram.values())}


# ---- flags -----------------------------------------------------------------------------------
def test_graph_memory_parsing():
    assert parse_graph_memory("2GiB") == ("bytes", 2 * 2**30)
    assert parse_graph_memory("500MB") == ("bytes", 500e6)
    assert parse_graph_memory("2e9") == ("bytes", 2e9)
    assert parse_graph_memory("0.05") == ("fraction", 0.05)
    for bad in ("", "x", "-1", "0", "3TB", "1.5 parsecs"):
        with pytest.raises(ValueError, match="cuda_graph_memory must be"):
            parse_graph_memory(bad)


def test_capture_flags_are_validated_on_cpu():
    assert EngineConfig().capture_mode == "startup"  # nothing is captured on CPU
    assert EngineConfig().ladder_mode == EngineConfig(cuda_graph_ladder="default").ladder_mode
    with pytest.raises(ValueError, match="must be one of"):
        EngineConfig(cuda_graph_capture="eventually")
    with pytest.raises(ValueError, match="default or auto"):
        EngineConfig(cuda_graph_ladder="learned")
    for bad in (dict(cuda_graph_capture="background"), dict(cuda_graph_ladder="auto"),
                dict(cuda_graph_memory="1GiB")):  # fmt: skip
        with pytest.raises(ValueError, match="where nothing is captured"):
            EngineConfig(**bad)
    with pytest.raises(ValueError, match="cuda_graph_memory must be"):
        EngineConfig(cuda_graph_memory="lots")


STARTUP_ONLY = [
    dict(speculative_algorithm="ngram"),
    dict(tensor_parallel_size=2),
    dict(decode_cuda_graph="tc_piecewise"),
    dict(prefill_cuda_graph="tc_piecewise"),
    dict(decode_cuda_graph="none", prefill_cuda_graph="none"),
]


def test_auto_capture_is_background_on_cuda_and_startup_where_background_is_refused(
    monkeypatch,
):
    """The config only reads the device type, so a CUDA machine is mocked."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert EngineConfig().capture_mode == "background"
    assert EngineConfig(decode_cuda_graph="none").capture_mode == "background"  # prefill's
    learned = EngineConfig(cuda_graph_ladder="auto", cuda_graph_memory="1GiB")
    assert learned.capture_mode == "background"
    # the ladder: learned under background capture unless asked otherwise
    assert EngineConfig().ladder_mode == "auto"
    assert EngineConfig(cuda_graph_ladder="default").ladder_mode == "default"
    assert EngineConfig(cuda_graph_capture="lazy").ladder_mode == "default"
    assert EngineConfig(cuda_graph_capture="lazy", cuda_graph_ladder="auto").ladder_mode == "auto"
    assert EngineConfig(cuda_graph_capture="startup").ladder_mode == "default"
    for kwargs in STARTUP_ONLY:  # auto resolved to startup: the configured ladders
        assert EngineConfig(**kwargs).ladder_mode == "default", kwargs
    assert EngineConfig(device="cpu").capture_mode == "startup"  # nothing is captured on CPU
    for kwargs in STARTUP_ONLY:
        assert EngineConfig(**kwargs).capture_mode == "startup", kwargs
    assert EngineConfig(cuda_graph_capture="lazy", **STARTUP_ONLY[2]).capture_mode == "lazy"


def test_explicit_background_keeps_its_refusals_and_their_advice_holds(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    refusals = ["'startup' \\(or 'auto'\\)", "startup \\(or auto\\)", "lazy, startup or auto",
                "lazy, startup or auto"]  # fmt: skip
    for kwargs, message in zip(STARTUP_ONLY, refusals):
        with pytest.raises(ValueError, match=message):
            EngineConfig(cuda_graph_capture="background", **kwargs)
        for advice in ("startup", "auto"):  # what the message says to use instead
            assert EngineConfig(cuda_graph_capture=advice, **kwargs).capture_mode == "startup"
    with pytest.raises(ValueError, match="start-up capture captures the whole configured ladder"):
        EngineConfig(cuda_graph_ladder="auto", **STARTUP_ONLY[1])  # auto resolved to startup


def test_capture_flags_reach_the_config_from_the_command_line():
    args = build_parser().parse_args(
        ["generate", "--prompt", "hi", "--cuda-graph-capture", "startup",
         "--cuda-graph-ladder", "default"]
    )  # fmt: skip
    config = engine_config_from(args)
    assert config.cuda_graph_capture == "startup" and config.cuda_graph_memory is None
    args = build_parser().parse_args(["generate", "--prompt", "hi", "--cuda-graph-capture", "lazy"])
    with pytest.raises(ValueError, match="where nothing is captured"):
        engine_config_from(args)


def test_histogram_and_ladder_reach_the_memory_report_and_metrics(llm):
    pytest.importorskip("prometheus_client")
    from types import SimpleNamespace

    from prometheus_client.parser import text_string_to_metric_families

    from nanograph.engine.front import FrontStats
    from nanograph.engine.memory import MemoryReport
    from nanograph.serve.metrics import ServerMetrics

    live, runners = live_runners(llm, "lazy")
    serve(llm, live, runners)
    stats = live.stats()
    decode = stats["paths"]["decode"]
    assert decode["histogram"] and set(decode["ready"]) <= set(decode["ladder"])
    table = MemoryReport(graph_capture=stats).table()
    assert "decode ladder (default): 1x1 2x2 4x4 8x8" in table
    assert (
        "decode observed sizes (size: batches): "
        + ", ".join(f"{n}: {c}" for n, c in decode["histogram"].items())
        in table
    )

    front = SimpleNamespace(stats=FrontStats(graph_capture=stats))
    families = {
        f.name: f for f in text_string_to_metric_families(ServerMetrics(front).render().decode())
    }
    buckets = {
        s.labels["le"]: s.value
        for s in families["nanograph_batch_size"].samples
        if s.name.endswith("_bucket") and s.labels["path"] == "decode"
    }
    histogram = decode["histogram"]
    assert buckets["4"] == sum(c for n, c in histogram.items() if n <= 4)
    assert buckets["+Inf"] == sum(histogram.values())
    ready = {
        s.labels["state"]: s.value
        for s in families["nanograph_graph_shapes"].samples
        if s.labels["path"] == "decode"
    }
    assert ready["ready"] == len(decode["ready"])
    ladder = {s.labels["shape"] for s in families["nanograph_graph_ladder"].samples}
    assert {"1x1", "8x8", "64x2"} <= ladder


# ---- bench startup --capture-modes (the device runs it; its arithmetic runs here) ------------
def test_capture_bench_curve_and_aims():
    from nanograph.bench.capture_modes import compare, curve

    xs, ys = curve([(10.0, 0), (10.5, 50), (11.0, 100), (12.0, 300), (12.5, 310)])
    assert xs == [11.0, 12.0] and ys == [100.0, 200.0]
    arms = {
        "eager": {"ready_s": 10.0, "graph_bytes": 0, "curve": {"t_s": [11], "tokens_per_s": [50]}},
        "startup": {"ready_s": 40.0, "graph_bytes": 1000, "steady_tokens_per_s": 100.0,
                    "curve": {"t_s": [41, 42], "tokens_per_s": [100, 100]}},
        "background:default": {"ready_s": 10.5, "graph_bytes": 800, "ladder_mode": "default",
                               "curve": {"t_s": [11, 20, 30], "tokens_per_s": [50, 90, 96]}},
        # background's default ladder is the learned one
        "background": {"ready_s": 10.5, "graph_bytes": 300, "ladder_mode": "auto",
                       "curve": {"t_s": [11, 25], "tokens_per_s": [50, 99]}},
        "lazy:auto": {"ready_s": 10.0, "graph_bytes": 100, "ladder_mode": "auto",
                      "curve": {"t_s": [11], "tokens_per_s": [10]}},
        "lazy": {"error": ["boom"]},
    }  # fmt: skip
    aims = compare(arms)
    assert aims["ready_over_eager"]["background:default"] == pytest.approx(1.05)
    assert aims["reach_95pct_of_startup_s"] == {
        "eager": None, "startup": 41, "background:default": 30, "background": 25,
        "lazy:auto": None,
    }  # fmt: skip
    assert aims["graph_bytes_background_over_startup"] == 0.3
    assert aims["graph_bytes_background_over_background:default"] == pytest.approx(0.375)
    assert aims["graph_bytes_lazy:auto_over_startup"] == 0.1  # no lazy arm of default ladder
    assert len([k for k in aims if k.startswith("graph_bytes")]) == 3


def test_capture_bench_refuses_graph_arms_without_cuda_and_bad_names():
    from nanograph.bench.startup import main

    if torch.cuda.is_available():
        pytest.skip("checks the CPU refusal")
    with pytest.raises(ValueError, match="need CUDA"):
        main(["--capture-modes", "eager,background", "--out", "/dev/null"])
    with pytest.raises(ValueError, match="unknown capture arm"):
        main(["--capture-modes", "eager,sometimes", "--out", "/dev/null"])


def test_planned_budget_estimates_from_the_activation_peak_or_takes_the_flag():
    # 2 x a 100 MiB peak at 8192 tokens: 25.6 KB per token; decode's 256 tokens fall under the
    # 64 MiB floor of a pool
    budget = GraphBudget.planned({"decode": 256, "prefill": 8192}, 100 * 2**20, 8192)
    assert budget.bytes_per_token == {"decode": 25600.0, "prefill": 25600.0}
    assert budget.limit == 64 * 2**20 + 200 * 2**20
    assert GraphBudget.planned({"decode": 256}, 100 * 2**20, 8192, limit=10**9).limit == 10**9


def test_capture_bench_repeats_report_the_median_run():
    from nanograph.bench.capture_modes import median_run

    def run(ready, steady):
        return {"ready_s": ready, "load_s": ready, "phases": {"weights": 1.0},
                "ttft_first_s": 0.1, "capture_done_s": None, "steady_tokens_per_s": steady,
                "graph_bytes": 7, "curve": {"t_s": [ready], "tokens_per_s": [steady]}}  # fmt: skip

    arm = median_run([run(9.0, 100.0), {"error": ["boom"]}, run(5.0, 300.0), run(7.0, 200.0)])
    assert arm["ready_s"] == 7.0 and arm["steady_tokens_per_s"] == 200.0
    assert arm["curve"] == {"t_s": [7.0], "tokens_per_s": [200.0]}  # the median-ready run's
    assert arm["failed_runs"] == 1 and len(arm["runs"]) == 4
    assert arm["runs"][1] == {"error": ["boom"]}
    assert median_run([{"error": ["x"]}]) == {"error": ["x"]}
