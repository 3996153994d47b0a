"""fsspec's own generic test suite (``fsspec.tests.abstract``) run on
``LorsFileSystem`` against real depots: what s3fs, gcsfs and the local
filesystem pass, ``lors://`` passes."""

from __future__ import annotations

import os

import fsspec.tests.abstract as abstract
import pytest

from lors.fs import LorsFileSystem


@pytest.fixture(scope="module")
def module_depots(tmp_path_factory):
    from conftest import Depot

    base = tmp_path_factory.mktemp("abstract-depots")
    ds = [Depot(base / f"depot{i}") for i in range(3)]
    yield ds
    for d in ds:
        d.kill()


class LorsFixtures(abstract.AbstractFixtures):
    @pytest.fixture
    def fs(self, module_depots):
        # Not the instance fsspec caches: each test starts without leftovers.
        return LorsFileSystem(depots=[d.addr for d in module_depots], copies=1, skip_instance_cache=True)

    @pytest.fixture
    def fs_path(self, tmp_path):
        p = tmp_path / "lors"
        p.mkdir()
        return str(p)

    @pytest.fixture
    def fs_join(self):
        return os.path.join

    @pytest.fixture
    def supports_empty_directories(self):
        return True


class TestLorsCopy(abstract.AbstractCopyTests, LorsFixtures):
    pass


class TestLorsGet(abstract.AbstractGetTests, LorsFixtures):
    pass


class TestLorsPut(abstract.AbstractPutTests, LorsFixtures):
    pass


class TestLorsOpen(abstract.AbstractOpenTests, LorsFixtures):
    pass


class TestLorsPipe(abstract.AbstractPipeTests, LorsFixtures):
    pass
