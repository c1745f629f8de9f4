"""A conversation as stories260K-chat renders it, and the tokens of each rendering, written out by hand from
the rendered strings (listed in the comments) for test_data_chat.py: never computed with the code under test."""

CONV = [
    {"role": "system", "content": "Be kind."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello."},
    {"role": "user", "content": "More?"},
    {"role": "assistant", "content": "Bye."},
]

# stories260K-chat renders CONV as
#   '<s>System: Be kind.\nUser: Hi\nAssistant: Hello.</s>\nUser: More?\nAssistant: Bye.</s>\n'
# with ' ' + content + '</s>' of each assistant turn inside the template's generation block.
# Its 60 tokens (sentencepiece writes a '▁' after '</s>', at the offsets of the '\n' that follows):
TOKENS = [
    "<s>",
    "▁S",
    "y",
    "st",
    "e",
    "m",
    ":",
    "▁B",
    "e",
    "▁k",
    "i",
    "nd",
    ".",
    "<0x0A>",  # 0-13
    "U",
    "s",
    "er",
    ":",
    "▁H",
    "i",
    "<0x0A>",  # 14-20
    "A",
    "s",
    "s",
    "is",
    "t",
    "an",
    "t",
    ":",  # 21-28
    "▁He",
    "ll",
    "o",
    ".",
    "</s>",  # 29-33: ' Hello.</s>', trained
    "▁",
    "<0x0A>",  # 34-35
    "U",
    "s",
    "er",
    ":",
    "▁M",
    "o",
    "re",
    "?",
    "<0x0A>",  # 36-44
    "A",
    "s",
    "s",
    "is",
    "t",
    "an",
    "t",
    ":",  # 45-52
    "▁B",
    "y",
    "e",
    ".",
    "</s>",  # 53-57: ' Bye.</s>', trained
    "▁",
    "<0x0A>",  # 58-59
]
IDS = [
    1,
    301,
    422,
    356,
    411,
    423,
    467,
    368,
    411,
    409,
    417,
    264,
    426,
    13,
    471,
    419,
    285,
    467,
    320,
    417,
    13,
    447,
    419,
    419,
    293,
    413,
    303,
    413,
    467,
    346,
    306,
    414,
    426,
    2,
    410,
    13,
    471,
    419,
    285,
    467,
    392,
    414,
    276,
    450,
    13,
    447,
    419,
    419,
    293,
    413,
    303,
    413,
    467,
    368,
    422,
    411,
    426,
    2,
    410,
    13,
]
FIRST_TURN = [29, 30, 31, 32, 33]
LAST_TURN = [53, 54, 55, 56, 57]

# A template without generation blocks that writes ' [end]' after the assistant's content and a
# newline after every message. It renders CONV as
#   '<|system|>\nBe kind.\n<|user|>\nHi\n<|assistant|>\nHello. [end]\n<|user|>\nMore?\n<|assistant|>\nBye. [end]\n'
# The generation prompt '<|assistant|>\n' ends at character 46 (first turn) and 88 (second turn);
# the turns add 'Hello. [end]' (characters 46-58) and 'Bye. [end]' (88-98), each before a '\n'.
END_MARKER_TEMPLATE = (
    "{% for m in messages %}{{ '<|' + m['role'] + '|>\\n' + m['content'] }}"
    "{% if m['role'] == 'assistant' %}{{ ' [end]' }}{% endif %}{{ '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)
END_MARKER_TOKENS = [
    "▁",
    "<",
    "|",
    "s",
    "y",
    "st",
    "e",
    "m",
    "|",
    ">",
    "<0x0A>",  # 0-10
    "B",
    "e",
    "▁k",
    "i",
    "nd",
    ".",
    "<0x0A>",  # 11-17
    "<",
    "|",
    "u",
    "s",
    "er",
    "|",
    ">",
    "<0x0A>",
    "H",
    "i",
    "<0x0A>",  # 18-28
    "<",
    "|",
    "a",
    "s",
    "s",
    "is",
    "t",
    "an",
    "t",
    "|",
    ">",
    "<0x0A>",  # 29-40
    "H",
    "e",
    "ll",
    "o",
    ".",
    "▁",
    "[",
    "end",
    "]",  # 41-49: 'Hello. [end]', trained
    "<0x0A>",  # 50: the trailing newline, not trained
    "<",
    "|",
    "u",
    "s",
    "er",
    "|",
    ">",
    "<0x0A>",
    "M",
    "o",
    "re",
    "?",
    "<0x0A>",  # 51-63
    "<",
    "|",
    "a",
    "s",
    "s",
    "is",
    "t",
    "an",
    "t",
    "|",
    ">",
    "<0x0A>",  # 64-75
    "B",
    "y",
    "e",
    ".",
    "▁",
    "[",
    "end",
    "]",  # 76-83: 'Bye. [end]', trained
    "<0x0A>",  # 84
]
