from infc.compiler.memory_plan import lifetimes, plan_memory


def _chain(n):
    steps = [{"inputs": ["x" if i == 0 else f"v{i - 1}"], "outputs": [f"v{i}"]} for i in range(n)]
    return steps, [f"v{n - 1}"]


def test_chain_reuses_memory():
    steps, outputs = _chain(6)
    sizes = {f"v{i}": 1024 for i in range(6)}
    plan = plan_memory(steps, outputs, sizes, {"x": [1]})
    assert plan.sum_activation_bytes == 6 * 1024
    assert plan.arena_bytes == 2 * 1024  # a chain needs two live buffers at a time


def test_overlapping_lifetimes_never_share_bytes():
    steps = [{"inputs": ["x"], "outputs": ["a"]}, {"inputs": ["x"], "outputs": ["b"]},
             {"inputs": ["a", "b"], "outputs": ["c"]}, {"inputs": ["c", "a"], "outputs": ["d"]}]
    sizes = {"a": 100, "b": 300, "c": 200, "d": 50}
    plan = plan_memory(steps, ["d"], sizes, {})
    spans = lifetimes(steps, ["d"])
    names = list(sizes)
    for i, p in enumerate(names):
        for q in names[i + 1:]:
            overlap_time = not (spans[p][1] < spans[q][0] or spans[q][1] < spans[p][0])
            overlap_bytes = plan.offsets[p] < plan.offsets[q] + sizes[q] and plan.offsets[q] < plan.offsets[p] + sizes[p]
            assert not (overlap_time and overlap_bytes), (p, q)
    assert all(offset % 64 == 0 for offset in plan.offsets.values())
