// Render pixel-art faces with DiceBear (designs CC0 1.0, code MIT) into a CelebA-format folder.
//
//   node render.mjs --out DIR --n N --seed S [--size 16]
//
// Each face's attributes are drawn independently and balanced from a PRNG seeded with S: smiling (a happy or a sad
// mouth), glasses, hat (each present or absent), hair (one of four colours). Every other option (eyes, skin,
// clothing, accessories, beard, which mouth, glasses, hat and hairstyle) is DiceBear's own draw from the face's seed.
// The same arguments give the same bytes. Writes DIR/000000.png ... and DIR/list_attr_celeba.txt.
import { createAvatar } from '@dicebear/core';
import { pixelArt } from '@dicebear/collection';
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

function args(argv) {
  const out = { size: 16 };
  for (let i = 0; i < argv.length; i += 2) {
    const key = argv[i].replace(/^--/, '');
    if (!['out', 'n', 'seed', 'size'].includes(key) || argv[i + 1] === undefined) {
      console.error(`render.mjs: unknown or incomplete option ${argv[i]}; valid: --out DIR --n N --seed S [--size 16]`);
      process.exit(2);
    }
    out[key] = key === 'out' ? argv[i + 1] : Number(argv[i + 1]);
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
const groups = Object.keys(HAIR);
const rows = [];
for (let i = 0; i < opts.n; i++) {
  const smiling = random() < 0.5;
  const glasses = random() < 0.5;
  const hat = random() < 0.5;
  const hair = groups[Math.floor(random() * groups.length)];
  const avatar = createAvatar(pixelArt, {
    seed: `${opts.seed}-${i}`,
    mouth: smiling ? HAPPY : SAD,
    glassesProbability: glasses ? 100 : 0,
    hatProbability: hat ? 100 : 0,
    hairColor: HAIR[hair],
    ...(hat ? { hair: LONG_HAIR } : {}),
    backgroundColor: [BACKGROUND],
  });
  const png = new Resvg(avatar.toString(), { fitTo: { mode: 'width', value: opts.size }, shapeRendering: 0 })
    .render().asPng();
  const name = `${String(i).padStart(6, '0')}.png`;
  fs.writeFileSync(path.join(opts.out, name), png);
  rows.push(`${name} ${smiling ? 1 : -1} ${glasses ? 1 : -1} ${hat ? 1 : -1} ${hair}`);
}
fs.writeFileSync(path.join(opts.out, 'list_attr_celeba.txt'), [String(opts.n), 'smiling glasses hat hair', ...rows].join('\n') + '\n');
console.log(`rendered ${opts.n} faces into ${opts.out}`);
