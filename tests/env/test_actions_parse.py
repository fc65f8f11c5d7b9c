"""The action grammar: what parses, what it parses to, and the error messages for what does not."""

from __future__ import annotations

import json

import pytest

from webrl_core.env.actions import Action, ActionParseError, parse_action


@pytest.mark.parametrize("text,name,arg,el", [
    ('do(action="Click", element="12")', "Click", None, "12"),
    ('# Element: the search box\n# Note: "x"\ndo(action="Type", argument="red shoes", element="3")', "Type", "red shoes", "3"),
    ('do(action="Search", argument="a \\"quoted\\" b", element=7)', "Search", 'a "quoted" b', "7"),
    ('do(action="Hover", element="0")', "Hover", None, "0"),
    ('do(action="Scroll Down")', "Scroll Down", None, None),
    ('do(action="scroll up")', "Scroll Up", None, None),
    ('do(action="Press Enter")', "Press Enter", None, None),
    ('do(action="Select Dropdown Option", argument="Blue", element="5")', "Select Dropdown Option", "Blue", "5"),
    ('do(action="Go backward")', "Go backward", None, None),
    ('do(action="Go forward")', "Go forward", None, None),
    ('do(action="Right Click", element="2")', "Right Click", None, "2"),
    ('do(action="Wait")', "Wait", None, None),
    ('do(action="Switch Tab", argument="1")', "Switch Tab", "1", None),
    ("go_backward()", "Go backward", None, None),
    ("go_forward()", "Go forward", None, None),
    ('do(action="Click", element="4")<|eot_id|>', "Click", None, "4"),
    ('```\ndo(action="Click", element="4")\n```', "Click", None, "4"),
])
def test_valid_actions(text, name, arg, el):
    a = parse_action(text)
    assert (a.name, a.argument, a.element) == (name, arg, el)
    json.loads(a.to_json())


def test_exit_and_comments():
    a = parse_action('# Note: total is 3\nexit(message="The answer is 3")')
    assert a.name == "exit" and a.message == "The answer is 3"
    assert a.comments == ["# Note: total is 3"]
    assert parse_action("exit()").message == ""
    assert parse_action('exit("positional")').message == "positional"


def test_last_parsable_keyword_wins():
    # a keyword inside an earlier string or a later broken call must not confuse the parser
    a = parse_action('exit(message="I will do(action) later")')
    assert a.name == "exit" and "do(action)" in a.message
    a = parse_action('I thought about do(action="Click", element="1") but\ndo(action="Click", element="2")')
    assert a.element == "2"
    assert parse_action('undo(x)\ndo(action="Press Enter")').name == "Press Enter"


@pytest.mark.parametrize("text,needle", [
    ("", "empty"),
    ("click the button", "no action found"),
    ('do(action="Fly", element="1")', "unknown action"),
    ('do(action="Click")', "needs element"),
    ('do(action="Type", element="3")', "needs argument"),
    ('do(action="Click", element="abc")', "numeric id"),
    ('do("Click", "1")', "keyword arguments"),
    ('do(action="Click", element="1", speed=3)', "unknown argument"),
    ('do(action="Click", element=__import__("os").system("true"))', "literal"),
    ('do(action="Click", element="1"', "cannot parse"),
    ("go_backward(1)", "no arguments"),
])
def test_invalid_actions_have_clear_errors(text, needle):
    with pytest.raises(ActionParseError) as e:
        parse_action(text)
    assert needle in str(e.value)


def test_action_str_round_trips():
    for a in (Action("Click", element="3"), Action("Type", argument='say "hi"', element="1"), Action("exit", message="x")):
        b = parse_action(str(a))
        assert b.key() == a.key()
