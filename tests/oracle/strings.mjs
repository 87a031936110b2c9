// Seeded random test strings for tokenizer comparisons: mixed scripts (Latin, Cyrillic, Greek,
// CJK, Hangul, kana, Arabic, Devanagari, Thai), emoji incl. skin tones, ZWJ sequences, flags and
// keycaps, combining marks, digit runs, whitespace runs (\r\n, \t, unusual Unicode spaces),
// contractions, and strings that look like special tokens (and full-width look-alikes).
// Never emits lone surrogates, so every string is valid UTF-8 once encoded.

export function rng(seed) {  // mulberry32
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6D2B79F5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const SPECIALS = ['<|im_end|>', '<|im_start|>', '<s>', '</s>', '<unk>', '<think>', '</think>',
  '<|endoftext|>', '<|eot_id|>', '<|begin_of_text|>', '<|end|>', '<|user|>', '<|assistant|>',
  '[INST]', '[/INST]', '<0x0A>', '<0xFF>', '<|fim_prefix|>', '<｜end▁of▁sentence｜>',
  '<｜begin▁of▁sentence｜>', '＜｜im_end｜＞', '＜s＞', '＜/think＞', '<|im_end|', '|im_end|>',
  '<<s>>', '<|start_header_id|>', '<|reserved_special_token_5|>', '▁', '▁▁', '<|endoftext|><|endoftext|>'];
const WORDS = ['the', 'The', 'hello', 'Hello', 'world', 'tokenizer', 'don\'t', "I'm", "we'LL", "it's",
  "you'VE", 'cafe\u0301', 'naïve', 'Äpfel', 'straße', 'ﬁnance', 'ǅemal', 'İstanbul', 'ΑΒΓ', 'привет',
  'Бълг', 'γειά', 'שלום', 'مرحبا', 'नमस्ते', 'हिन्दी', 'สวัสดี', 'こんにちは', 'カタカナ', '漢字', '中文测试',
  '한국어', '안녕하세요', 'ꙮ', '𝔘𝔫𝔦𝔠𝔬𝔡𝔢', '𐐷', 'ﬀ', 'µ', 'Ωmega', 'K', 'x²', '½', 'Ⅻ', '١٢٣', '٤٥'];
const EMOJI = ['🦙', '😀', '👍🏽', '👨‍👩‍👧‍👦', '🏳️‍🌈', '👩🏾‍💻', '🇫🇷', '🇯🇵', '1️⃣', '#️⃣', '❤️', '✌🏻',
  '🧑‍🤝‍🧑', '🫠', '😶‍🌫️', '🐻‍❄️', '☺', '©', '™', '🔥🔥🔥'];
const SPACES = [' ', '  ', '   ', '\t', '\n', '\r\n', '\n\n', '\r', ' \n ', '\u00a0', '\u2003', '\u3000',
  '\u200b', '\u2009', '\u202f', '\u0085', '\u2028', '\u000b', '\f', '\t\t', '        '];
const PUNCT = ['.', ',', '!', '?', '...', '—', '–', '"', "'", '(', ')', '[', ']', '{', '}', '<', '>',
  '/', '\\', '@', '#', '$', '%', '^', '&', '*', '_', '+', '=', '|', '~', '`', '«»', '“”', '、', '。',
  '！', '？', '：', '；', '（）', '…', '¿', '¡', '§', '€', '£', '¥', '→', '∑', '∞', '✓'];
const RANGES = [[0x20, 0x7e], [0xa0, 0x24f], [0x300, 0x36f], [0x370, 0x3ff], [0x400, 0x4ff],
  [0x530, 0x58f], [0x590, 0x5ff], [0x600, 0x6ff], [0x900, 0x97f], [0x980, 0x9ff], [0xe00, 0xe7f],
  [0x10a0, 0x10ff], [0x1100, 0x11ff], [0x1e00, 0x1fff], [0x2000, 0x206f], [0x2100, 0x22ff],
  [0x2460, 0x24ff], [0x2e80, 0x2fdf], [0x3000, 0x30ff], [0x3400, 0x4dbf], [0x4e00, 0x9fff],
  [0xac00, 0xd7a3], [0xe000, 0xe0ff], [0xf900, 0xfaff], [0xfb00, 0xfdff], [0xfe00, 0xfe6f],
  [0xff00, 0xffef], [0xfff0, 0xfffd], [0x10000, 0x1007f], [0x1d400, 0x1d7ff], [0x1f300, 0x1faff],
  [0x20000, 0x2a6df], [0xe0000, 0xe007f],
  // assigned after Unicode 15.1 (llama.cpp's tables treat them as unassigned)
  [0x1c80, 0x1c8f], [0x10d40, 0x10d8f], [0x1fa80, 0x1faff]];

export function randomStrings(seed, count) {
  const r = rng(seed);
  const pick = (a) => a[Math.floor(r() * a.length)];
  const int = (lo, hi) => lo + Math.floor(r() * (hi - lo + 1));
  const pieces = [
    () => pick(WORDS),
    () => pick(SPECIALS),
    () => pick(EMOJI),
    () => pick(SPACES),
    () => pick(PUNCT),
    () => String(int(0, 10 ** int(1, 9))),          // digit runs
    () => '0123456789'.repeat(int(1, 4)).slice(int(0, 9)),
    () => { const [lo, hi] = pick(RANGES); let s = ''; for (let k = int(1, 6); k > 0; k--) s += String.fromCodePoint(int(lo, hi)); return s; },
    () => pick(WORDS) + String.fromCodePoint(int(0x300, 0x36f)) + String.fromCodePoint(int(0x300, 0x36f)),
    () => pick(SPACES).repeat(int(2, 12)),
    () => pick(['a', ' ', '!', '1', '漢', '\n', 'é', '🦙']).repeat(int(5, 60)),
  ];
  const out = [];
  for (let i = 0; i < count; i++) {
    let s = '';
    const n = int(1, 24);
    for (let k = 0; k < n; k++) s += pick(pieces)();
    if (r() < 0.1) s = ' ' + s;
    out.push(s);
  }
  return out;
}
