"""The func: side of program_html (env/site_queries.py): expressions parsed with ast (never eval) and called from a
registry of helpers. The helpers that read pages or the sites' REST API run against a live page in
test_evaluators.py."""

from __future__ import annotations

import asyncio

import pytest

from webrl_core.env import site_queries as sq


def run(coro):
    return asyncio.run(coro)


def test_parse_helper_call_accepts_literals_and_special_names():
    call = sq.parse_helper_call("func:helper(__page__, 'a', [1, 2], n=3)")
    assert call.name == "helper" and call.args[1:] == ["a", [1, 2]] and call.kwargs == {"n": 3}


@pytest.mark.parametrize("expr", ["func:__import__('os').system('true')", "func:helper(open('x'))",
                                  "func:helper(page)", "func:helper(*args)", "func:x.y()", "func:1 + 2"])
def test_parse_helper_call_rejects_code(expr):
    with pytest.raises(ValueError, match="func expression"):
        sq.parse_helper_call(expr)


def test_call_helper_binds_last_url_and_rejects_unknown_names():
    helpers = sq.default_helpers()
    out = run(sq.call_helper("func:reddit_get_post_url('__last_url__')", helpers,
                             last_url="http://h:9999/f/books/12/some-title/comment/3"))
    assert out == "http://h:9999/f/books/12/"
    assert sq.reddit_get_post_url("http://h:9999/forums") == "http://h:9999/forums"
    with pytest.raises(ValueError, match="unknown helper 'nope'"):
        run(sq.call_helper("func:nope()", helpers))
