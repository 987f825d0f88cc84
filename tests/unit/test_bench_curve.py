"""tools/bench/curve.py: the three modes it compares run and check what they claim (a frame
with a wrong tag or a replayed counter is refused in `mac` mode), so the figures
docs/performance.md gives come from code that works."""

from __future__ import annotations

import pytest

from tools.bench import curve


def test_a_mac_tag_is_checked_and_a_replayed_or_altered_frame_is_refused() -> None:
    key = b"k" * curve.MAC_KEY_BYTES
    tag = curve.mac_tag(key, 7, b"frame")
    assert curve.mac_check(key, tag, b"frame", last=6) == 7
    with pytest.raises(ValueError):
        curve.mac_check(key, tag, b"frame", last=7)  # replayed: the counter did not rise
    with pytest.raises(ValueError):
        curve.mac_check(key, tag, b"framE", last=6)  # altered
    with pytest.raises(ValueError):
        curve.mac_check(b"x" * curve.MAC_KEY_BYTES, tag, b"frame", last=6)  # another key


@pytest.mark.parametrize("mode", curve.MODES)
def test_each_mode_streams_frames_and_reports_its_cpu(mode: str) -> None:
    r = curve.run(4096, 0.2, 8, mode)
    assert r["mode"] == mode and r["frames_per_s"] > 0 and r["cpu_us_per_frame"] > 0
