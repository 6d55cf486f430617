"""What `TextWorldEnv` hands the Z-machine: one line of printable ASCII, and never a command that acts on the
interpreter, the files around it or TextWorld's state tracker instead of the story.

TextWorld tracks the game from the outside: it turns on Inform's action trace and a `<score>` tag at the start, and
reads the score, the win and the admissible commands from what the story prints afterwards. A command that rewinds
or restarts the story leaves that tracker describing another game (`me, restart` then `y` used to replay the start
behind it), and some commands write files into the trainer's working directory. `refusal(command)` screens a reply
before the engine sees it; a refused reply is answered with a message and leaves the game untouched.

Refused, in any form the story's parser would act on:

* `restart`, `restore`, `quit`/`q`, `undo`: they rewind or end the story behind the tracker (`restart` and `quit`
  also leave a yes/no question pending, which the next reply would answer);
* `again`/`g`, `oops`/`o`: they replay or rewrite an earlier command;
* `save`, `script`/`transcript` (and the Inform 6 spellings `unscript`, `noscript`): they write a saved game or a
  transcript into the working directory;
* TextWorld's framework commands `tw-trace-actions`, `tw-extra-infos ...`, `tw-print ...`, `print_state`,
  `enable`/`disable print state option` and `restrict commands`: they change what the story prints for the
  tracker, or print the hidden state of the whole world;
* `[` and `]`: Inform echoes some replies inside its action trace (`say ] [opening the box - succeeded`), where
  TextWorld would read a forged action.

Passed through: the other out-of-world commands (`score`, `notify`, `pronouns`, `version`, `verify`, `verbose`,
`brief`, `superbrief`, TextWorld's `goal` and `help`) and `yes`/`no`. They only print, and change nothing that is
scored or tracked; with `quit` and `restart` refused no question is ever pending, so `y` is a rhetorical answer.

The screening follows the parser of Inform 7 stories on the Z-machine: input is lower-cased; words are split at
spaces and at the dictionary's word separators `.`, `,` and `"`; a word is compared at the dictionary's resolution
(`dictionary_key`: "transcripts" is "transcript"). The listed words are refused wherever they stand, so no analysis
of chains (`look. restart`, `look then restart`, `look, restart`) or orders (`me, restart`) can miss one. The
one-letter abbreviations `q`, `g` and `o` are refused only where the parser reads a verb (first word, or after `.`,
`,`, `"` or `then`), because TextWorld also names objects with single letters ("type Q box": `take q` is a move).
"""

from __future__ import annotations

import re
import unicodedata

MAX_ACTION_CHARS = 198  # Jericho's input buffer; it truncates longer commands itself, with a warning


def normalize_action(action: str) -> str:
    """The action as the Z-machine can take it: one line of printable ASCII, at most `MAX_ACTION_CHARS` long.

    Accents are folded (`café` -> `cafe`) and other non-ASCII characters dropped: the games' words are ASCII, and
    Jericho hands the interpreter raw UTF-8 bytes, which it reads as other characters. Control characters become
    spaces: some (e.g. `\\x14`) make the interpreter wait forever, and a newline would end the command early.
    Backslashes become spaces too: the dumb-frotz interpreter reads `\\q`, `\\help`, ... as its own commands and
    then waits for input forever.
    """
    text = unicodedata.normalize("NFKD", action).encode("ascii", "ignore").decode("ascii")
    text = "".join(char if char.isprintable() and char != "\\" else " " for char in text)
    return " ".join(text.split())[:MAX_ACTION_CHARS]


# Z-machine alphabet A2 from Z-character 8 on (version 5+; 6 escapes to ZSCII, 7 is a newline).
_ALPHABET_A2 = "0123456789.,!?_#'\"/\\-:()"
DICTIONARY_ZCHARS = 9  # a version 4+ dictionary word: 6 bytes of three 5-bit Z-characters per 2 bytes
WORD_SEPARATORS = '.,"'  # the dictionary's separators in every story Inform 7 compiles


def dictionary_key(word: str) -> tuple[int, ...]:
    """`word` as the story's dictionary compares it: its first `DICTIONARY_ZCHARS` Z-characters.

    Z-machine standard, sections 3 and 13: a-z take one Z-character each, the digits and punctuation of alphabet
    A2 two (shift 5, then the character), any other character four (shift, escape 6, then its 10-bit code); the
    sequence is cut after 9 Z-characters and padded with 5s. Two words are the same word to the parser exactly when
    their keys are equal: "transcripts" and "transcript" (both "transcrip"), "print_stuff" and "print_state".
    """
    zchars: list[int] = []
    for char in word.lower():
        if "a" <= char <= "z":
            zchars.append(ord(char) - ord("a") + 6)
        elif char in _ALPHABET_A2:
            zchars += [5, _ALPHABET_A2.index(char) + 8]
        else:
            zchars += [5, 6, ord(char) >> 5, ord(char) & 31]
    return tuple((zchars + [5] * DICTIONARY_ZCHARS)[:DICTIONARY_ZCHARS])


def story_words(command: str) -> list[str]:
    """The words the story's parser reads in `command`: lower-cased, split at spaces, each separator a word."""
    return re.findall(rf'[{WORD_SEPARATORS}]|[^\s{WORD_SEPARATORS}]+', command.lower())


REFUSED_WORDS = (
    "restart", "restore", "quit", "undo", "again", "oops",  # rewind, end, replay or rewrite the story
    "save", "script", "transcript", "unscript", "noscript",  # write files into the working directory
    "tw-trace-actions", "tw-extra-infos", "tw-print", "print_state", "enable", "disable", "restrict",  # TextWorld's
)
REFUSED_VERBS = ("q", "g", "o")  # quit, again, oops: refused where the parser reads a verb
_REFUSED_WORD_KEYS = {dictionary_key(word) for word in REFUSED_WORDS}
_REFUSED_VERB_KEYS = {dictionary_key(word) for word in REFUSED_VERBS}
_VERB_FOLLOWS = {dictionary_key(word) for word in (*WORD_SEPARATORS, "then")}


def refused_word(command: str) -> str | None:
    """The first word of `command` (as the story reads it) that makes the whole reply refused, or None.

    `command` is what `normalize_action` returns. See the module docstring for the rules.
    """
    for bracket in "[]":
        if bracket in command:
            return bracket
    words = story_words(command)
    for index, word in enumerate(words):
        key = dictionary_key(word)
        reads_verb = index == 0 or dictionary_key(words[index - 1]) in _VERB_FOLLOWS
        if key in _REFUSED_WORD_KEYS or (reads_verb and key in _REFUSED_VERB_KEYS):
            return word
    return None
