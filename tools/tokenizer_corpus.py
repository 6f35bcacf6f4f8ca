"""Training corpus and test strings for tools/gen_tokenizer_goldens.py.

Everything here is deterministic: the embedded paragraphs are fixed, and the generated parts come from
`random.Random` with fixed seeds.
"""

import random

ENGLISH = """\
The river keeper opened the gate at dawn, and the water ran fast through the old stone channel.
In the spring the water is high; in the autumn it is low and slow, and the keeper opens the gate only a little.
She said, "It's not the river that's changed, it's the people who've forgotten how to listen."
They'll be back tomorrow, and we'd better have the boats ready. I'm sure you're right, but don't hurry.
WHAT'S THE PLAN? We're going north at 6:30 a.m. on March 14th, 2024, with 3 boats and 12 people.
Tokenizers split text into pieces before merging bytes; the merge with the lowest rank always wins.
A quick brown fox jumps over the lazy dog. The five boxing wizards jump quickly. Sphinx of black quartz!
Numbers like 3.14159, 2.71828, 1,000,000 and 0x1F4A9 appear in technical writing all the time.
Email me at keeper@example.com or visit https://example.org/river/gates?id=42&lang=en#top for details.
"""

CHINESE = """\
河流管理员在黎明时打开了闸门，水流迅速穿过古老的石头水道。
春天水位很高，秋天水位很低，管理员只把闸门打开一点点。
她说：“不是河流变了，而是人们忘记了如何倾听。”
分词器在合并字节之前先把文本切分成片段；排名最低的合并总是优先。
今天是二零二四年三月十四日，我们有三条船和十二个人，计划早上六点半出发。
机器学习模型需要大量的数据来训练，而推理引擎需要高效地读取权重。
中文、日本語、한국어都是东亚语言，它们的文字系统各不相同。
漢字の読み書きは難しいですが、とても面白いです。ひらがなとカタカナもあります。
"""

RUSSIAN = """\
Смотритель реки открыл шлюз на рассвете, и вода быстро побежала по старому каменному каналу.
Весной вода высокая, осенью низкая и медленная, и смотритель открывает шлюз совсем немного.
Она сказала: «Изменилась не река, а люди, которые забыли, как слушать».
Токенизатор делит текст на части перед слиянием байтов; побеждает слияние с наименьшим рангом.
МОСКВА, 14 марта 2024 года. Привет, мир! Как дела? Всё хорошо, спасибо.
Съешь же ещё этих мягких французских булок, да выпей чаю. Щука, ёж, юла, эхо, ящик.
"""

ARABIC = """\
فتح حارس النهر البوابة عند الفجر، وجرى الماء بسرعة عبر القناة الحجرية القديمة.
في الربيع يكون الماء مرتفعًا، وفي الخريف يكون منخفضًا وبطيئًا.
قالت: «ليس النهر هو الذي تغير، بل الناس الذين نسوا كيف يستمعون».
مَرْحَبًا بِالْعَالَمِ. الأرقام ١٢٣٤٥٦٧٨٩٠ تُكتب من اليسار إلى اليمين.
"""

OTHER = """\
नमस्ते दुनिया। नदी का रखवाला सुबह फाटक खोलता है। यह एक परीक्षण वाक्य है।
Ο φύλακας του ποταμού άνοιξε την πύλη την αυγή. Καλημέρα κόσμε!
Der Flußwächter öffnete das Tor. Größere Übungen für Mädchen und Jungen. Ça va? Très bien, merci.
¿Dónde está la biblioteca? ¡Qué día tan bonito! Ñandú, pingüino, acción.
강의 관리인은 새벽에 문을 열었다. 안녕하세요, 세계!
สวัสดีครับ นี่คือประโยคทดสอบ
Emoji: 😀 😃 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 ❤️ 🇯🇵 🇺🇸 🎉🎉🎉
"""

CODE = '''\
def byte_pair_merge(piece: bytes, ranks: dict[bytes, int]) -> list[int]:
    """Merge the adjacent pair with the lowest rank until none is left."""
    parts = [(i, ranks.get(piece[i:i + 2], MAX)) for i in range(len(piece) - 1)]
    while len(parts) > 1:
        rank, i = min((r, k) for k, (_, r) in enumerate(parts[:-1]))
        if rank == MAX:
            break
        parts.pop(i + 1)
    return [ranks[piece[a:b]] for (a, _), (b, _) in zip(parts, parts[1:])]


pub fn encode_ordinary(&self, text: &str) -> Vec<u32> {
    let mut out = Vec::with_capacity(text.len() / 3);
    for piece in self.regex.find_iter(text) {
        match self.encoder.get(piece.as_bytes()) {
            Some(&rank) => out.push(rank),
            None => out.extend(self.byte_pair_encode(piece.as_bytes())),
        }
    }
    out
}

{"role": "user", "content": "Hello, world!", "tool_calls": [], "temperature": 0.7, "top_p": 0.95}
<html><head><title>River &amp; Gate</title></head><body class="main">&lt;p&gt;</body></html>
SELECT id, name, COUNT(*) AS n FROM gates WHERE opened_at >= '2024-03-14' GROUP BY id ORDER BY n DESC;
for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; } // dot product
if x != None and y <= 10 or z >= -3: print(f"{x!r:>10} {y:08.3f}")
========================================
----------------------------------------
########################################
'''


def _numbers(rng):
    out = []
    for _ in range(400):
        k = rng.randint(1, 12)
        out.append(str(rng.randint(10 ** (k - 1), 10 ** k - 1)))
        if rng.random() < 0.3:
            out.append(f"{rng.random() * 1000:.{rng.randint(1, 5)}f}")
    return " ".join(out) + "\n"


def _shuffled_lines(rng, texts, n):
    lines = [line for t in texts for line in t.splitlines() if line]
    out = []
    for _ in range(n):
        words = rng.choice(lines).split(" ")
        rng.shuffle(words)
        out.append(" ".join(words))
    return "\n".join(out) + "\n"


def _whitespace(rng):
    out = []
    for _ in range(200):
        out.append(rng.choice(["    ", "\t", "\n", "\r\n", "  ", "        ", "\n\n", " \n"]) * rng.randint(1, 4))
        out.append(rng.choice(["x", "if", "return", "}", "{", "end", "пока", "结束"]))
    return "".join(out) + "\n"


def corpus():
    rng = random.Random(20240314)
    texts = [ENGLISH, CHINESE, RUSSIAN, ARABIC, OTHER, CODE]
    parts = [t * 3 for t in texts]
    parts.append(_shuffled_lines(rng, texts, 1500))
    parts.append(_numbers(rng))
    parts.append(_whitespace(rng))
    return "".join(parts)


def _random_strings(seed, count):
    """Seeded random strings drawn from blocks that stress the pre-tokeniser."""
    rng = random.Random(seed)
    pools = [
        (0x20, 0x7E), (0x00, 0x1F), (0xA0, 0xFF), (0x100, 0x17F), (0x300, 0x36F), (0x370, 0x3FF),
        (0x400, 0x4FF), (0x590, 0x5FF), (0x600, 0x6FF), (0x900, 0x97F), (0xE00, 0xE7F), (0x1100, 0x11FF),
        (0x2000, 0x206F), (0x2070, 0x209F), (0x2100, 0x218F), (0x2460, 0x24FF), (0x3000, 0x303F),
        (0x3040, 0x30FF), (0x4E00, 0x9FFF), (0xAC00, 0xD7A3), (0xE000, 0xE0FF), (0xFE00, 0xFE0F),
        (0xFF00, 0xFFEF), (0x1F300, 0x1F64F), (0x1F900, 0x1F9FF), (0x20000, 0x2A6DF), (0xE0000, 0xE007F),
        (0x10FFF0, 0x10FFFF),
    ]
    out = []
    for i in range(count):
        n = rng.randint(1, 60)
        chars = []
        for _ in range(n):
            lo, hi = rng.choice(pools)
            chars.append(chr(rng.randint(lo, hi)))
        out.append((f"random_{i:02}", "".join(chars)))
    return out


def test_cases():
    """(name, text) pairs; a text is a str or a list of (string, repeat) parts for long inputs."""
    t = [
        ("empty", ""),
        ("space", " "),
        ("english", ENGLISH.splitlines()[0]),
        ("english_para", ENGLISH),
        ("contractions_lower", "it's don't we're they've I'm you'll he'd"),
        ("contractions_upper", "IT'S DON'T WE'RE THEY'VE I'M YOU'LL HE'D"),
        ("contractions_mixed", "It'S dOn'T We'Re 'll 's 'd rock'n'roll o'clock y'all'd've 'tis"),
        ("contractions_unicode", "it\u2019s ſ'S K's Straße'S ǅ'll"),
        ("han", "河流管理员在黎明时打开了闸门"),
        ("han_mixed", "中文abc中文ABC中文123中文 中文\n中文"),
        ("japanese", "漢字の読み書きは難しいですが、とても面白いです。カタカナ"),
        ("korean", "강의 관리인은 새벽에 문을 열었다. 안녕하세요!"),
        ("cyrillic", "Привет, мир! ПРИВЕТ Мир. Съешь же ещё этих мягких булок."),
        ("arabic", "مَرْحَبًا بِالْعَالَمِ ١٢٣٤٥"),
        ("hebrew", "שָׁלוֹם עוֹלָם"),
        ("devanagari", "नमस्ते दुनिया। यह एक परीक्षण है।"),
        ("thai", "สวัสดีครับ นี่คือประโยคทดสอบ"),
        ("greek", "Ο φύλακας ΤΟΥ ποταμού"),
        ("mixed_scripts", "The 河流 river Река نهر नदी 강 🌊 flows"),
        ("titlecase_modifier", "ǅemal ǈubljana ǋ ʰʲʷ ˈstress ᵃᵇ"),
        ("camel_case", "XMLHttpRequest camelCaseWord HTTPServer iPhone getURLForID ABCdefGHI"),
        ("combining_acute", "e\u0301te\u0301 cafe\u0301"),
        ("combining_stack", "a\u0300\u0301\u0302\u0303 Z\u0337\u0322a\u0335l\u0336g\u0334o\u0338"),
        ("combining_leading", "\u0301abc \u0308 \u20dd"),
        ("emoji_simple", "😀😃 👍 🎉🎉🎉"),
        ("emoji_skin_tone", "👍🏽 👋🏿"),
        ("emoji_zwj_family", "👨‍👩‍👧‍👦 family"),
        ("emoji_zwj_flag", "🏳️‍🌈 🏴‍☠️ 🇺🇸🇯🇵"),
        ("emoji_keycap", "1️⃣ #️⃣ ❤️"),
        ("zero_width", "a\u200bb\u200cc\u200dd\ufeffe\u2060f"),
        ("digits_1_to_10", " ".join("1234567890"[:k] for k in range(1, 11))),
        ("digits_glued", "".join(f"x{'9' * k}" for k in range(1, 11))),
        ("digits_other", "٣٤٥ ①②③ ⅫⅣ ½¾ ¹²³ 𝟙𝟚𝟛"),
        ("decimal_numbers", "3.14159 -2.5e-10 1,000,000 0x1F4A9 v1.2.3"),
        ("spaces_runs", "a b  c   d    e     f      g"),
        ("tabs", "\tx\t\ty\t\t\tz"),
        ("crlf", "line1\r\nline2\r\n\r\nline3\n\r\n"),
        ("newlines_spaces", "  \n  \n\n   x  \n\t\n"),
        ("trailing_ws", "trailing   "),
        ("trailing_ws_newline", "end \n \t "),
        ("leading_ws", "   leading"),
        ("only_ws_mix", " \t \r\n \t\x0b\x0c "),
        ("unicode_spaces", "a\u00a0b\u2003c\u3000全角\u2028d\u2029e\u0085f\u1680g"),
        ("isspace_not_whitespace", "a\x1cb\x1dc\x1ed\x1fe"),
        ("control_chars", "\x00abc\x01\x07\x7f\x1b[0m"),
        ("special_open", "<|open|>"),
        ("special_markup", '<|open|>message role="user"<|sep|>hi<|close|>message<|sep|><|end_of_msg|>'),
        ("special_brackets", "[BOS] [EOS] [PAD] [UNK] [start_header_id]"),
        ("special_reserved", "<|reserved_token_42|><|media_pad|>"),
        ("punctuation", "!!!??? ... —–- «quotes» “smart” ¿Qué? (a) [b] {c} <d>"),
        ("code_python", CODE.split("\n\n\n")[0]),
        ("code_rust", CODE.split("\n\n\n")[1].split("\n\n")[0]),
        ("json", '{"key": [1, 2.5, true, null], "nested": {"a": "b\\n"}}'),
        ("url_email", "https://example.org/a/b?x=1&y=2#frag keeper@example.com /usr/local/bin"),
        ("noncharacters", "\ufffd\uffff\ue000\U0010FFFF\U000E0041"),
        ("corpus_sample", corpus()[:3000]),
        # Long inputs: the 25,000-character run split and the 400,000-character slices.
        ("long_equals_30000", [("=", 30000)]),
        ("long_spaces_30000", [(" ", 30000)]),
        ("long_spaces_then_word", [(" ", 25000), ("x", 1)]),
        ("long_a_25000", [("a", 25000)]),
        ("long_a_25001", [("a", 25001)]),
        ("long_a_50001", [("a", 50001)]),
        ("long_cyrillic_25003", [("ж", 25003)]),
        ("long_han_25005", [("中", 25005)]),
        ("long_newlines_26000", [("\n", 26000)]),
        ("long_alternating", [("ab ", 20000)]),
        ("long_ws_then_text", [("a", 25001), (" ", 25001), ("b", 3)]),
        ("long_mixed_word_run", [("hello", 5001), (" world", 3)]),
        ("long_river_run", [("river", 5003)]),
        ("long_han_words", [("中文字", 8335)]),
        ("long_400k_slice", [("ab", 1), (" the", 100000)]),
        ("long_400k_slice_words", [("zzz", 1), ("hello world ", 33334)]),
    ]
    return t + _random_strings(7, 40)
