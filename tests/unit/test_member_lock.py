"""The cross-process member lock (node/host/member_lock.py): DLedger's synchronized(memberState).

Other processes are real interpreters (``sys.executable -c``), as the role processes are.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
from child_process import Child

from node.host.member_lock import LockTimeout, MemberLock

# Holds the lock until told to release; prints the monotonic time just before releasing.
_HOLDER = """
    import sys, time
    from node.host.member_lock import MemberLock
    lock = MemberLock(sys.argv[1])
    lock.acquire()
    print("held", flush=True)
    sys.stdin.readline()
    print("releasing", time.monotonic_ns(), flush=True)
    lock.release()
    print("released", flush=True)
    sys.stdin.readline()
"""


@pytest.fixture
def lock_path(tmp_path: Path) -> str:
    return str(tmp_path / "member.lock")


def _spawn(children: list[Child], code: str, *args: str) -> Child:
    c = Child(code, *args)
    children.append(c)
    return c


def test_second_process_blocks_until_the_first_releases(lock_path: str, children) -> None:
    holder = _spawn(children, _HOLDER, lock_path)
    assert holder.line() == "held"
    waiter = _spawn(children, """
        import sys, time
        from node.host.member_lock import MemberLock
        lock = MemberLock(sys.argv[1])
        print("waiting", flush=True)
        with lock:                       # no timeout: blocks in the kernel
            print("acquired", time.monotonic_ns(), flush=True)
    """, lock_path)
    assert waiter.line() == "waiting"
    assert waiter.silent_for(0.3), "second process got the lock while the first held it"

    holder.send("release")
    word, t_release = holder.line().split()
    assert word == "releasing"
    word, t_acquired = waiter.line().split()
    assert word == "acquired"
    assert int(t_acquired) >= int(t_release)  # CLOCK_MONOTONIC is system-wide on Linux
    assert waiter.proc.wait(timeout=10) == 0


def test_critical_sections_of_two_processes_never_interleave(lock_path: str, tmp_path: Path,
                                                             children) -> None:
    """Two processes do read-increment-write on one file under the lock: no lost update."""
    counter = tmp_path / "counter"
    counter.write_text("0")
    code = """
        import sys
        from node.host.member_lock import MemberLock
        lock, path = MemberLock(sys.argv[1]), sys.argv[2]
        print("ready", flush=True)
        sys.stdin.readline()  # start together, so the loops really overlap
        for _ in range(500):
            with lock:
                with open(path) as f:
                    n = int(f.read())
                with open(path, "w") as f:
                    f.write(str(n + 1))
    """
    workers = [_spawn(children, code, lock_path, str(counter)) for _ in range(2)]
    assert [w.line() for w in workers] == ["ready", "ready"]
    for w in workers:
        w.send("go")
    assert [w.proc.wait(timeout=30) for w in workers] == [0, 0]
    assert counter.read_text() == "1000"


def test_a_sigkilled_holder_releases_the_lock(lock_path: str, children) -> None:
    holder = _spawn(children, _HOLDER, lock_path)
    assert holder.line() == "held"
    lock = MemberLock(lock_path)
    try:
        with pytest.raises(LockTimeout):
            lock.acquire(timeout=0)
        holder.kill()
        lock.acquire(timeout=5)  # the kernel dropped the dead holder's flock
        assert lock.held
        lock.release()
    finally:
        lock.close()


def test_timeout_raises_after_about_the_timeout(lock_path: str, children) -> None:
    holder = _spawn(children, _HOLDER, lock_path)
    assert holder.line() == "held"
    lock = MemberLock(lock_path, timeout=0.3)
    try:
        t0 = time.monotonic()
        with pytest.raises(LockTimeout, match="held by another process"):
            with lock:
                pytest.fail("entered a section another process holds")
        elapsed = time.monotonic() - t0
        assert 0.3 <= elapsed < 2.0
        assert not lock.held
        holder.send("release")
        assert holder.line().startswith("releasing") and holder.line() == "released"
        with lock:  # usable again after a timeout
            assert lock.held
    finally:
        lock.close()


def test_nested_sections_keep_the_lock_until_the_outermost_exit(lock_path: str) -> None:
    """flock belongs to the open file description: without the depth counter the inner exit
    would unlock the outer section. A second MemberLock (own descriptor) acts as the rival."""
    lock, rival = MemberLock(lock_path), MemberLock(lock_path)
    try:
        with lock:
            with lock:
                assert lock.held
            assert lock.held
            with pytest.raises(LockTimeout):
                rival.acquire(timeout=0)
        assert not lock.held
        rival.acquire(timeout=0)
        rival.release()
        with pytest.raises(RuntimeError, match="without a matching acquire"):
            lock.release()
    finally:
        lock.close()
        rival.close()


def test_threads_of_one_process_are_excluded_too(lock_path: str) -> None:
    lock = MemberLock(lock_path)
    outcome: list[BaseException | None] = []

    def other_thread() -> None:
        try:
            lock.acquire(timeout=0.1)
            outcome.append(None)
            lock.release()
        except LockTimeout as e:
            outcome.append(e)

    try:
        with lock:
            t = threading.Thread(target=other_thread)
            t.start()
            t.join(10)
        assert len(outcome) == 1 and isinstance(outcome[0], LockTimeout)
    finally:
        lock.close()


def test_a_forked_child_does_not_share_the_parents_lock(lock_path: str) -> None:
    """A child that reused the inherited descriptor would get the lock 'for free' while the
    parent holds it. Exit code 0 = the child saw the lock as taken, as it must."""
    lock = MemberLock(lock_path)
    try:
        with lock:
            pid = os.fork()
            if pid == 0:  # child: only os._exit from here
                try:
                    lock.acquire(timeout=0.05)
                    code = 1
                except LockTimeout:
                    code = 0
                except BaseException:
                    code = 2
                os._exit(code)
            _, status = os.waitpid(pid, 0)
            assert os.waitstatus_to_exitcode(status) == 0
            assert lock.held
    finally:
        lock.close()
