"""`make test-fast` leaves out the tests marked slow, and a test is marked slow by the fixtures it uses
(tests/conftest.py: `builds`), not by its author: a new test that asks for a built family lands in the slow lane
without saying so."""

from __future__ import annotations

import pytest

from tests.conftest import builds, pytest_collection_modifyitems, uses_a_slow_fixture


@pytest.fixture
@builds
def declared_slow():
    """Declared as building (it builds nothing here: only the declaration is under test)."""
    return "built"


@pytest.fixture
def through_a_declared_one(declared_slow):
    return declared_slow


def probe(request, name: str, function) -> pytest.Function:
    """A test item for `function` in this module, its fixtures resolved as pytest resolves a collected test's."""
    return pytest.Function.from_parent(request.node.parent, name=name, callobj=function)


def _uses_built(built): ...
def _uses_exported(exported): ...
def _uses_tiny(tiny): ...
def _uses_bucket(bucket): ...  # moto's S3 server, through s3_env
def _uses_cli(cli): ...  # the real CLI in a subprocess
def _uses_tiny_sd(tiny_sd): ...  # the tiny decoder engines are built from
def _uses_a_declared_fixture_indirectly(through_a_declared_one): ...
def _uses_only_cheap_fixtures(tmp_path, write_recipe, small_fs): ...


@pytest.mark.parametrize(
    "function",
    [
        _uses_built,
        _uses_exported,
        _uses_tiny,
        _uses_bucket,
        _uses_cli,
        _uses_tiny_sd,
        _uses_a_declared_fixture_indirectly,
    ],
    ids=lambda f: f.__name__,
)
def test_a_test_using_a_building_fixture_is_marked_slow(request, function):
    item = probe(request, function.__name__, function)
    assert uses_a_slow_fixture(item)
    assert item.get_closest_marker("slow") is None
    pytest_collection_modifyitems(request.config, [item])
    assert item.get_closest_marker("slow") is not None


def test_a_test_using_only_cheap_fixtures_stays_in_the_fast_lane(request):
    item = probe(request, "cheap", _uses_only_cheap_fixtures)
    pytest_collection_modifyitems(request.config, [item])
    assert not uses_a_slow_fixture(item) and item.get_closest_marker("slow") is None
    # this very test runs in the fast lane: nothing it uses is declared slow
    assert request.node.get_closest_marker("slow") is None
