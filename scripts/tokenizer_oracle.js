#!/usr/bin/env node
// Live oracle for pope's GPT-2 tokenizer: encodes each input file with js-tiktoken's `gpt2`
// encoding and compares with a token file that `pope-data tokenize --shard-tokens 0
// --val-fraction 0 --input FILE...` wrote for the same files in the same order (each document
// followed by <|endoftext|>).
//
// Usage: node scripts/tokenizer_oracle.js TOKENS.bin FILE_LIST
//   FILE_LIST: a text file with one input path per line, in the order given to pope-data.
// Needs js-tiktoken@1.0.21 resolvable by require (NODE_PATH=DIR/node_modules).
// Exit 0 when every document matches, 1 at the first mismatch (file, token index, ids).
'use strict';
const fs = require('fs');
const { getEncoding } = require('js-tiktoken');

const [tokensPath, listPath] = process.argv.slice(2);
if (!tokensPath || !listPath) {
  console.error('usage: node tokenizer_oracle.js TOKENS.bin FILE_LIST');
  process.exit(2);
}

const EOT = 50256;
const LLMC_HEADER_BYTES = 256 * 4;
const LLMC_MAGIC = 20240520;

const raw = fs.readFileSync(tokensPath);
if (raw.readInt32LE(0) !== LLMC_MAGIC) {
  console.error(`${tokensPath}: not an llm.c token file`);
  process.exit(1);
}
const count = raw.readInt32LE(8);
const pope = new Uint16Array(raw.buffer, raw.byteOffset + LLMC_HEADER_BYTES, count);

const encoding = getEncoding('gpt2');
const files = fs.readFileSync(listPath, 'utf8').split('\n').filter((line) => line.length > 0);
let position = 0;
let bytes = 0;
const started = process.hrtime.bigint();
for (const file of files) {
  const text = fs.readFileSync(file, 'utf8');
  if (text.length === 0) continue;  // pope-data skips empty documents
  bytes += Buffer.byteLength(text);
  const expected = encoding.encode(text, [], []);  // <|endoftext|> in text is plain text
  expected.push(EOT);
  for (let i = 0; i < expected.length; ++i) {
    if (pope[position + i] !== expected[i]) {
      const from = Math.max(0, i - 3);
      console.error(`MISMATCH in ${file} at token ${i}: pope ${JSON.stringify(Array.from(pope.slice(position + from, position + i + 4)))}` +
                    ` js-tiktoken ${JSON.stringify(expected.slice(from, i + 4))} (from token ${from})`);
      process.exit(1);
    }
  }
  position += expected.length;
}
if (position !== pope.length) {
  console.error(`${tokensPath} has ${pope.length} tokens, js-tiktoken gives ${position} for the listed files`);
  process.exit(1);
}
const seconds = Number(process.hrtime.bigint() - started) / 1e9;
console.log(`oracle: ${files.length} files, ${position} tokens equal to js-tiktoken@1.0.21 gpt2 ` +
            `(${(bytes / 1e6).toFixed(1)} MB, js-tiktoken ${(bytes / 1e6 / seconds).toFixed(2)} MB/s)`);
