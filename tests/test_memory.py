import platform

import pytest

from mt.memory import keep_freed_memory


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's mallopt only")
def test_glibc_keeps_freed_memory_unless_told_to_leave_it(monkeypatch):
    assert keep_freed_memory()
    monkeypatch.setenv("MT_MALLOC", "default")
    assert not keep_freed_memory()
