// node-llama-cpp generating from a GGUF, as its users run it: the prebuilt
// CPU backend chosen at run time (dlopen'd), nothing built here.
//
//   node generate.mjs MODEL PROMPT N
//
// Prints the program's own account of what it evaluated: the prompt's
// token ids (with the BOS node-llama-cpp prepends), the tokens it generated
// and how fast. llama.cpp's log (its buffer lines) goes through node-llama-cpp's
// logger, at debug level.
import {getLlama, LlamaCompletion, LlamaLogLevel} from "node-llama-cpp";

const [modelPath, prompt, maxTokens] = process.argv.slice(2);
const llama = await getLlama({gpu: false, build: "never", logLevel: LlamaLogLevel.debug});
const model = await llama.loadModel({modelPath});
const context = await model.createContext({contextSize: 256, threads: 2});
const sequence = context.getSequence();
const completion = new LlamaCompletion({contextSequence: sequence});
const started = performance.now();
await completion.generateCompletion(prompt, {maxTokens: Number(maxTokens)});
const seconds = (performance.now() - started) / 1000;
const ids = [...(model.tokens.shouldPrependBosToken ? [model.tokens.bos] : []), ...model.tokenize(prompt)];
console.log(`prompt_ids=${JSON.stringify(ids)}`);
console.log(`output_tokens=${sequence.tokenMeter.usedOutputTokens}`);
// The bench's figure: its tokens over the whole completion (the prompt's decode included).
console.log(`generated_tokens_per_s=${sequence.tokenMeter.usedOutputTokens / seconds}`);
await context.dispose();
await model.dispose();
await llama.dispose();
