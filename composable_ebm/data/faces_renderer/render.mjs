// Render DiceBear faces (designs CC0 1.0, code MIT) into a CelebA-format folder.
//
//   node render.mjs --out DIR --n N --seed S [--size 16] [--style pixel-art|lorelei] [--background fixed|random]
//
// Each face's attributes are drawn independently and balanced from a PRNG seeded with S; every other option is
// DiceBear's own draw from the face's seed. The same arguments give the same bytes. --background random draws each
// face's flat background colour from a second PRNG of the seed: the same faces as the fixed background's, over
// other colours. Writes DIR/000000.png ... and
// DIR/list_attr_celeba.txt.
//
// pixel-art (16x16 designs): smiling (a happy or a sad mouth), glasses, hat (each present or absent), hair (one of
// four colours); DiceBear draws eyes, skin, clothing, accessories, beard, which mouth, glasses, hat and hairstyle.
// lorelei (line art by Lisa Wischofsky, for 64 px and up): smiling, glasses, beard (each present or absent), hair
// (one of four colours, beard included); DiceBear draws head, eyes, eyebrows, nose, earrings, freckles, which
// mouth, glasses and beard, and the hairstyle.
import { createAvatar } from '@dicebear/core';
import { lorelei, pixelArt } from '@dicebear/collection';
import { Resvg } from '@resvg/resvg-js';
import fs from 'node:fs';
import path from 'node:path';

// One colour per hair group, far apart (DiceBear's own shades of a group are as close to the next group's as to each
// other at 16 px), so the colour is readable wherever hair shows.
const HAIR = {
  dark: ['28150a'],
  brown: ['83623b'],
  blond: ['cab188'],
  red: ['bd1700'],
};
// The mouths whose 16-px pixels say smiling or not: a smile curving up, a wide open smile, a grin with teeth
// (happy06, 09, 12, 13) against a frown and straight lines (sad01, 04-07). DiceBear's other designs are one-sided
// smirks and single pixels that draw the same pixels under either label.
const HAPPY = ['happy06', 'happy09', 'happy12', 'happy13'];
const SAD = ['sad01', 'sad04', 'sad05', 'sad06', 'sad07'];
// Under a hat only long hairstyles, whose hair shows below it: a short one is hidden whole, and its colour with it.
const LONG_HAIR = Array.from({ length: 21 }, (_, i) => `long${String(i + 1).padStart(2, '0')}`);
const BACKGROUND = 'e8eef4';

// lorelei: hair and beard share the colour, and the mouth is drawn in black over the beard, so no colour is as dark
// as the mouth's lines; the four are far apart in hue or lightness at 64 px.
const LORELEI_HAIR = {
  blond: ['d9b76e'],
  brown: ['83623b'],
  grey: ['a9aeb3'],
  red: ['bd1700'],
};
// The mouths a 64-px face shows as smiling or not: wide upturned smiles, open or closed (happy01, 03-06), against
// an open round mouth, a frown and a straight line (sad01, 04, 05). The other designs are small smirks, tongues and
// teeth that look alike under either label.
const LORELEI_HAPPY = ['happy01', 'happy03', 'happy04', 'happy05', 'happy06'];
const LORELEI_SAD = ['sad01', 'sad04', 'sad05'];
// Hairstyles whose hair shows its colour: 25, 28 and 34 are nearly bald.
const LORELEI_HAIRSTYLES = Array.from({ length: 48 }, (_, i) => `variant${String(i + 1).padStart(2, '0')}`)
  .filter((v) => !['variant25', 'variant28', 'variant34'].includes(v));

const STYLES = {
  'pixel-art': {
    columns: 'smiling glasses hat hair',
    hair: HAIR,
    draw(random, seed, hairNames, background) {
      const smiling = random() < 0.5;
      const glasses = random() < 0.5;
      const hat = random() < 0.5;
      const hair = hairNames[Math.floor(random() * hairNames.length)];
      const svg = createAvatar(pixelArt, {
        seed,
        mouth: smiling ? HAPPY : SAD,
        glassesProbability: glasses ? 100 : 0,
        hatProbability: hat ? 100 : 0,
        hairColor: HAIR[hair],
        ...(hat ? { hair: LONG_HAIR } : {}),
        backgroundColor: [background],
      }).toString();
      return { svg, row: [smiling, glasses, hat, hair], crisp: true };
    },
  },
  lorelei: {
    columns: 'smiling glasses beard hair',
    hair: LORELEI_HAIR,
    draw(random, seed, hairNames, background) {
      const smiling = random() < 0.5;
      const glasses = random() < 0.5;
      const beard = random() < 0.5;
      const hair = hairNames[Math.floor(random() * hairNames.length)];
      const svg = createAvatar(lorelei, {
        seed,
        mouth: smiling ? LORELEI_HAPPY : LORELEI_SAD,
        glassesProbability: glasses ? 100 : 0,
        beardProbability: beard ? 100 : 0,
        hairColor: LORELEI_HAIR[hair],
        hair: LORELEI_HAIRSTYLES,
        hairAccessoriesProbability: 0,
        backgroundColor: [background],
      }).toString();
      return { svg, row: [smiling, glasses, beard, hair], crisp: false };
    },
  },
};

function args(argv) {
  const out = { size: 16, style: 'pixel-art', background: 'fixed' };
  for (let i = 0; i < argv.length; i += 2) {
    const key = argv[i].replace(/^--/, '');
    if (!['out', 'n', 'seed', 'size', 'style', 'background'].includes(key) || argv[i + 1] === undefined) {
      console.error(`render.mjs: unknown or incomplete option ${argv[i]}; valid: --out DIR --n N --seed S [--size 16]`
        + ' [--style pixel-art|lorelei] [--background fixed|random]');
      process.exit(2);
    }
    out[key] = ['out', 'style', 'background'].includes(key) ? argv[i + 1] : Number(argv[i + 1]);
  }
  if (!['fixed', 'random'].includes(out.background)) {
    console.error(`render.mjs: unknown --background ${out.background}; valid: fixed, random`);
    process.exit(2);
  }
  if (!Object.hasOwn(STYLES, out.style)) {
    console.error(`render.mjs: unknown --style ${out.style}; valid: ${Object.keys(STYLES).join(', ')}`);
    process.exit(2);
  }
  for (const key of ['n', 'seed', 'size']) {
    if (!Number.isInteger(out[key]) || out[key] < 0) {
      console.error(`render.mjs: --${key} must be a whole number >= 0, got ${out[key]}`);
      process.exit(2);
    }
  }
  if (!out.out) {
    console.error('render.mjs: --out DIR is required');
    process.exit(2);
  }
  return out;
}

// mulberry32: a small seeded PRNG, so the attribute draws depend on the seed alone
function prng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const opts = args(process.argv.slice(2));
fs.mkdirSync(opts.out, { recursive: true });
const random = prng(opts.seed);
const backgrounds = prng(opts.seed ^ 0x5bd1e995); // its own stream: the faces are the fixed background's
const style = STYLES[opts.style];
const groups = Object.keys(style.hair);
const rows = [];
for (let i = 0; i < opts.n; i++) {
  const background = opts.background === 'fixed' ? BACKGROUND
    : Math.floor(backgrounds() * 0x1000000).toString(16).padStart(6, '0');
  const { svg, row, crisp } = style.draw(random, `${opts.seed}-${i}`, groups, background);
  // crisp: pixel-art's squares stay squares (no anti-aliasing); line art is anti-aliased
  const png = new Resvg(svg, { fitTo: { mode: 'width', value: opts.size }, shapeRendering: crisp ? 0 : 2 })
    .render().asPng();
  const name = `${String(i).padStart(6, '0')}.png`;
  fs.writeFileSync(path.join(opts.out, name), png);
  const [a, b, c, hair] = row;
  rows.push(`${name} ${a ? 1 : -1} ${b ? 1 : -1} ${c ? 1 : -1} ${hair}`);
}
fs.writeFileSync(path.join(opts.out, 'list_attr_celeba.txt'), [String(opts.n), style.columns, ...rows].join('\n') + '\n');
console.log(`rendered ${opts.n} faces into ${opts.out}`);
