"""The compact page rendering (``webrl_core.compact_page``) and the prompt formats that use it: every id once, one
line per block; the default prompt unchanged. (Every held-out oracle step's element in the prompt the policy sees:
tests/sites/test_prompt_elements.py.)"""

from __future__ import annotations

import re

from webrl_core.compact_page import compact_page
from webrl_core.prompts import BOS, ORM_SYSTEM, PromptFormat, build_orm_prompt, build_prompt

PAGE = ('<body> <header> <a id="0"> Shop </a> <form> <input id="1" type="text" placeholder="Search"/> '
        '<button id="2" type="submit"> Go </button> </form> </header> <main> <h1> Orders </h1> <tbody> '
        '<tr> <th> Order # </th> <th> Total </th> </tr> <tr> <td> 0042 </td> <td> $5.00 </td> '
        '<a id="3"> View </a> </tr> </tbody> <label> Role <select id="4" data-value="Guest"> '
        '<option data-status="selected"> Guest </option> <option> Owner </option> </select> </label> '
        '<input id="5" type="checkbox" data-status="checked"/> <input id="6" type="text" value="a &amp; b"/> '
        '<a id="7" title="Close"></a> <p> Total </p> </main> </body>')


def test_blocks_are_lines_and_elements_their_ids():
    text = compact_page(PAGE)
    assert text.splitlines() == [
        "[0] Shop",
        '[1] input "Search" [2] button Go',
        "# Orders",
        "Order # | Total",
        "0042 | $5.00 [3] View",
        'Role [4] select "Guest" options: Guest | Owner [5] input checkbox checked [6] input value="a & b" '
        "[7] Close",
        "Total",
    ]
    assert re.findall(r"\[(\d+)\]", text) == [str(i) for i in range(8)]  # every id once, in page order


def test_id_after_writes_each_id_after_what_names_its_element():
    text = compact_page(PAGE, id_after=True)
    assert text.splitlines() == [
        "Shop [0]",
        'input "Search" [1] button Go [2]',
        "# Orders",
        "Order # | Total",
        "0042 | $5.00 View [3]",
        'Role select "Guest" [4] options: Guest | Owner input checkbox checked [5] input value="a & b" [6] '
        "Close [7]",
        "Total",
    ]
    assert re.findall(r"\[(\d+)\]", text) == [str(i) for i in range(8)]
    assert re.sub(r" ?\[\d+\]", "", text) == re.sub(r"\[\d+\] ?", "", compact_page(PAGE))  # same text, ids moved
    nested = compact_page('<body> <div id="0"> <a id="1"> Edit </a> row </div> </body>', id_after=True)
    assert nested == "Edit [1] row [0]"
    fmt = PromptFormat(observation="compact_id_after")
    assert fmt.key != PromptFormat(observation="compact").key
    assert "Home [0]" in build_prompt("Go home", [], '<body> <a id="0"> Home </a> </body>', compat=fmt)


def test_error_line_is_kept_and_a_cut_page_still_renders():
    text = compact_page('[error] element 9 not found\n<body> <a id="0"> Home </a> <select id="1" data-value="A"> '
                        '<option> A')
    assert text.splitlines()[0] == "[error] element 9 not found"
    assert "[0] Home" in text and '[1] select "A"' in text


def test_formats_keep_the_default_prompt_and_key():
    html = '<body> <a id="0"> Home </a> </body>'
    assert build_prompt("Go home", [], html, compat=PromptFormat()) == build_prompt("Go home", [], html)
    assert PromptFormat().key == "webrl" and PromptFormat(compat="official").key == "official"
    compact = PromptFormat(observation="compact")
    assert compact.key != "webrl" and "[0] Home" in build_prompt("Go home", [], html, compat=compact)


def test_chat_format_renders_through_the_models_template():
    template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    fmt = PromptFormat(style="chat", observation="compact", chat_template=template)
    prompt = build_prompt("Buy a lamp", ['# Element: Shop\ndo(action="Click", element="0")'],
                          '<body> <a id="0"> Shop </a> </body>', compat=fmt)
    assert "<|eot_id|>" not in prompt and "<|start_header_id|>" not in prompt
    assert prompt.endswith("[0] Shop\n\nTask: Buy a lamp<|im_end|>\n<|im_start|>assistant\n")
    assert prompt.count("<|im_start|>assistant\n") == 2  # one past round, then the generation prompt
    assert fmt.key.startswith("webrl/chat/compact/")


def test_orm_prompt_reads_the_end_state_as_the_actor_reads_its_pages():
    template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    html = '<body> <a id="0"> Shop </a> <p> Order placed </p> </body>'
    responses = ['# Element: Shop\ndo(action="Click", element="0")', 'exit(message="Done")']
    assert build_orm_prompt("Buy a lamp", responses, html, compat=PromptFormat()) == \
        build_orm_prompt("Buy a lamp", responses, html)  # the default layout is unchanged
    compact = build_orm_prompt("Buy a lamp", responses, html, compat=PromptFormat(observation="compact"))
    assert "[0] Shop\nOrder placed" in compact and "<a id" not in compact and compact.startswith(BOS)
    fmt = PromptFormat(style="chat", observation="compact", chat_template=template)
    chat = build_orm_prompt("Buy a lamp", responses, html, compat=fmt)
    assert chat.startswith(f"<|im_start|>system\n{ORM_SYSTEM}<|im_end|>\n<|im_start|>user\nThe User Intent:\nBuy a lamp")
    assert "Action History:\n# Element: Shop; do(action=\"Click\", element=\"0\")\nexit(message=\"Done\")" in chat
    assert chat.endswith("The Current Screenshot:\n[0] Shop\nOrder placed<|im_end|>\n<|im_start|>assistant\n")
    assert "<|eot_id|>" not in chat and "<|start_header_id|>" not in chat
    cut = build_orm_prompt("Buy a lamp", responses, html * 50, max_chars=len(chat), compat=fmt)
    assert len(cut) <= len(chat) and "The Current Screenshot:\n[0] Shop" in cut  # the page is cut, not the question
    assert cut.endswith("<|im_end|>\n<|im_start|>assistant\n")
