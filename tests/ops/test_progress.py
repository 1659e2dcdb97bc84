from ops.progress import Progress


def test_progress_lines_give_done_total_rate_and_eta_and_always_log_the_end():
    t = [0.0]
    lines = []
    p = Progress(10, "verify", lines.append, every_s=5.0, clock=lambda: t[0])
    for _ in range(4):
        t[0] += 1.0
        p.update()
    assert lines == []  # rate-limited: under 5 s since the start
    t[0] += 1.0
    p.update()  # 5 done in 5 s: 1 item/s, 5 left
    assert lines == ["verify: 5/10 items (50%) · 1.00 items/s · ETA 5 s"]
    t[0] += 0.5
    p.update(5)  # the last unit always logs
    assert lines[-1] == "verify: 10/10 items (100%) · 1.82 items/s · ETA 0 s"
