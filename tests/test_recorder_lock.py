"""The recorder's lock: the C RecorderLock (capture/_recorder_lock.c) behaves as threading.RLock, its fallback."""
from __future__ import annotations

import contextlib
import signal
import threading
import time

import pytest

from msprobe_nb.capture import c_contract

_built = c_contract.recorder_lock()
needs_c = pytest.mark.skipif(_built is None, reason="msprobe_nb.capture._recorder_lock is not built (no C compiler "
                                                    "at install): the recorder uses threading.RLock")


@pytest.fixture(autouse=True)
def _watchdog():
    """A lock that is never given back would hang the test in a wait: an alarm interrupts it (the C lock checks
    for signals while it waits) and fails the test instead."""
    if not hasattr(signal, "setitimer"):
        yield
        return

    def expire(signum, frame):
        raise TimeoutError("the lock was not given back within 20 s")
    old = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, 20)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


KINDS = [pytest.param(lambda: _built.RecorderLock(), id="RecorderLock", marks=needs_c),
         pytest.param(threading.RLock, id="RLock")]


@needs_c
def test_the_recorder_takes_the_c_lock_where_it_is_built():
    from msprobe_nb.capture.recorder import Recorder
    from msprobe_nb.config import DumpConfig
    rec = Recorder(DumpConfig(stack=False))
    assert type(rec.lock) is _built.RecorderLock
    assert rec.c_parts()["lock_acquire"].__self__ is rec.lock  # the C paths take the same lock


@pytest.mark.parametrize("make", KINDS)
def test_the_owner_takes_it_again_and_gives_it_back_as_often(make):
    lock = make()
    assert lock.acquire() is True and lock.acquire() is True
    assert lock._is_owned()
    lock.release()
    assert lock._is_owned()  # still held once
    assert not _try(lock)  # held by this thread: another cannot take it
    lock.release()
    assert not lock._is_owned()
    assert _try(lock)
    with pytest.raises(RuntimeError, match="un-acquired"):
        lock.release()


def _try(lock) -> bool:
    """Whether another thread can take ``lock`` within 0.2 s (RecorderLock's acquire always waits)."""
    done = threading.Event()

    def take():
        lock.acquire()
        done.set()
        lock.release()
    threading.Thread(target=take, daemon=True).start()
    return done.wait(0.2)


@contextlib.contextmanager
def _held_elsewhere(lock):
    """``lock`` held by another thread for the duration of the block."""
    held, stop = threading.Event(), threading.Event()

    def hold():
        with lock:
            held.set()
            stop.wait(10)
    t = threading.Thread(target=hold)
    t.start()
    assert held.wait(5)
    try:
        yield
    finally:
        stop.set()
        t.join()


@pytest.mark.parametrize("make", KINDS)
def test_a_thread_that_does_not_hold_it_cannot_release_it(make):
    lock = make()
    lock.acquire()
    errors = []

    def release():
        try:
            lock.release()
        except RuntimeError as e:
            errors.append(str(e))
    t = threading.Thread(target=release)
    t.start()
    t.join()
    assert errors and "un-acquired" in errors[0]
    assert lock._is_owned()
    lock.release()


@pytest.mark.parametrize("make", KINDS)
def test_threads_take_turns_and_a_waiter_gets_it_once_it_is_free(make):
    lock, inside, most, total = make(), [0], [0], [0]

    def work():
        for _ in range(200):
            with lock:
                with lock:  # reentrant inside the turn
                    inside[0] += 1
                    most[0] = max(most[0], inside[0])
                    total[0] += 1
                    if total[0] % 50 == 0:
                        time.sleep(0.001)  # let the others wait on it (the GIL is released while they do)
                    inside[0] -= 1
    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert total[0] == 800 and most[0] == 1  # never two threads inside at once
    assert not lock._is_owned() and _try(lock)  # free at the end


@pytest.mark.parametrize("make", KINDS)
def test_an_exception_in_the_with_block_gives_it_back(make):
    lock = make()
    with pytest.raises(KeyError):
        with lock:
            {}["missing"]
    assert not lock._is_owned() and _try(lock)


@needs_c
@pytest.mark.skipif(not hasattr(signal, "setitimer"), reason="needs POSIX interval timers")
def test_a_signal_interrupts_a_thread_waiting_for_it():
    """A thread waiting on the lock still runs signal handlers: Ctrl-C stops a program stuck on it."""
    lock = _built.RecorderLock()

    class Alarm(Exception):
        pass

    def raise_alarm(signum, frame):
        raise Alarm
    with _held_elsewhere(lock):
        old = signal.signal(signal.SIGALRM, raise_alarm)
        try:
            signal.setitimer(signal.ITIMER_REAL, 0.2)
            t0 = time.monotonic()
            with pytest.raises(Alarm):
                lock.acquire()
            assert time.monotonic() - t0 < 5
            assert not lock._is_owned()
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
    assert _try(lock)


@pytest.mark.parametrize("make", KINDS)
def test_acquire_takes_rlock_s_arguments(make):
    """blocking and timeout as threading.RLock takes them (the kit's own tests and users may pass them)."""
    lock = make()
    assert lock.acquire(blocking=False) is True and lock.acquire(False) is True  # reentrant either way
    lock.release()
    lock.release()
    with _held_elsewhere(lock):
        assert lock.acquire(blocking=False) is False
        t0 = time.monotonic()
        assert lock.acquire(timeout=0.15) is False
        assert 0.14 <= time.monotonic() - t0 < 5
        assert lock.acquire(True, 0) is False
    assert lock.acquire(timeout=5) is True
    lock.release()
    with pytest.raises(ValueError, match="non-blocking"):
        lock.acquire(False, 1)
    with pytest.raises(ValueError, match="must be positive"):
        lock.acquire(timeout=-2)
    with pytest.raises(TypeError):
        lock.acquire(wait=True)
    with pytest.raises(ValueError, match="NaN"):
        lock.acquire(timeout=float("nan"))
    with pytest.raises(TypeError):
        lock.acquire(timeout=None)
    assert not lock._is_owned()


@needs_c
def test_it_is_made_without_arguments():
    with pytest.raises(TypeError):
        _built.RecorderLock(1)
    with pytest.raises(TypeError, match="multiple values"):
        _built.RecorderLock().acquire(True, blocking=True)


def test_a_stale_build_is_refused_with_a_warning(monkeypatch):
    """An extension built with another ABI is not taken: the recorder falls back to threading.RLock."""
    import types
    stale = types.SimpleNamespace(ABI=c_contract.RECORDER_LOCK_ABI + 1, RecorderLock=object)
    monkeypatch.setattr(c_contract, "_load", lambda name: stale)
    with pytest.warns(RuntimeWarning, match="_recorder_lock does not match"):
        assert c_contract.recorder_lock() is None
