"""Name grounding (``agent.grounding``): the named element's id replaces a mistyped one, and only then."""

from __future__ import annotations

import asyncio

from webrl_core.agent.grounding import NameGroundedPolicy, applies, ground_response
from webrl_core.agent.rollout_policy import make_policy, rollout_identity
from webrl_core.agent_api import StepContext
from webrl_core.artifacts import ArtifactRef
from webrl_core.compact_page import element_texts
from webrl_core.config_loader import load_config

FORUMS = ('<body> <header> <a id="0"> Postmill </a> <a id="1"> Forums </a> <input id="3" type="text" '
          'placeholder="Search"/> </header> <main> <h1> Forums </h1> <ul> <li> <a id="10"> gardening </a> 24 '
          'submissions </li> <li> <a id="11"> movies </a> 24 submissions </li> <li> <a id="13"> photography </a> '
          '</li> <li> <a id="14"> Edit </a> </li> <li> <a id="15"> Edit </a> </li> </ul> </main> </body>')


def click(name: str, element: str) -> str:
    return f'# Element: {name}\ndo(action="Click", element="{element}")'


def test_element_texts_are_what_the_compact_page_names():
    assert element_texts(FORUMS) == {"0": "Postmill", "1": "Forums", "3": "Search", "10": "gardening",
                                     "11": "movies", "13": "photography", "14": "Edit", "15": "Edit"}


def test_the_named_element_wins_over_a_mistyped_id():
    assert ground_response(click("movies", "13"), FORUMS) == click("movies", "11")
    assert ground_response(click("Movies", "13"), FORUMS) == click("Movies", "11")  # case-insensitive fallback
    typed = '# Element: Search\ndo(action="Type", argument="movies", element="1")'
    assert ground_response(typed, FORUMS) == typed.replace('element="1"', 'element="3"')


def test_a_response_stays_as_written_unless_one_other_element_has_its_name():
    for response in (click("movies", "11"),          # already right
                     click("Edit", "10"),            # two elements named Edit: ambiguous
                     click("the movies forum", "13"),  # names no element
                     'do(action="Click", element="13")',  # names nothing
                     '# Element: movies\nexit(message="Done")',  # no element to fix
                     "# Element: movies\nnot an action"):
        assert ground_response(response, FORUMS) == response


def test_scopes_and_the_episode_key():
    assert applies("phases", "rollout") and not applies("phases", "eval") and not applies("phases", "bootstrap")
    assert applies("all", "eval") and not applies("off", "rollout")
    settings = load_config("demo")
    grounded = settings.model_copy(update={"policy": settings.policy.model_copy(update={"name_grounding": "phases"})})
    actor = ArtifactRef("actor", "0" * 64, "model")
    assert rollout_identity(grounded, actor, 0.7, "rollout")["settings_digest"] != \
        rollout_identity(settings, actor, 0.7, "rollout")["settings_digest"]
    assert rollout_identity(grounded, actor, 0.0, "eval") == rollout_identity(settings, actor, 0.0, "eval")
    assert not isinstance(make_policy(grounded, None, 0.0, "random"), NameGroundedPolicy)  # scripted: as written


class Fixed:
    policy_id = "fixed"

    def __init__(self, responses):
        self.responses = responses

    async def act(self, prompts, contexts=None):
        return list(self.responses)


def test_the_wrapper_grounds_each_response_on_its_own_page_and_counts():
    policy = NameGroundedPolicy(Fixed([click("movies", "13"), click("movies", "13")]))
    other = FORUMS.replace('id="11"', 'id="12"')
    ctx = [StepContext(task={}, html=FORUMS, url="", step=0), StepContext(task={}, html=other, url="", step=0)]
    assert asyncio.run(policy.act(["p", "p"], ctx)) == [click("movies", "11"), click("movies", "12")]
    assert policy.rewrites == 2 and policy.policy_id == "fixed"
