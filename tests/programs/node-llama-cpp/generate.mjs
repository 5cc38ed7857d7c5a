// node-llama-cpp generating from a GGUF, as its users run it: the prebuilt
// CPU backend chosen at run time (dlopen'd), nothing built here.
//
//   node generate.mjs MODEL PROMPT N
//
// Prints the program's own account of what it evaluated: the prompt's
// token ids (with the BOS node-llama-cpp prepends) and the tokens it
// generated. llama.cpp's log (its buffer lines) goes through node-llama-cpp's
// logger, at debug level.
import {getLlama, LlamaCompletion, LlamaLogLevel} from "node-llama-cpp";

const [modelPath, prompt, maxTokens] = process.argv.slice(2);
const llama = await getLlama({gpu: false, build: "never", logLevel: LlamaLogLevel.debug});
const model = await llama.loadModel({modelPath});
const context = await model.createContext({contextSize: 256, threads: 2});
const sequence = context.getSequence();
const completion = new LlamaCompletion({contextSequence: sequence});
await completion.generateCompletion(prompt, {maxTokens: Number(maxTokens)});
const ids = [...(model.tokens.shouldPrependBosToken ? [model.tokens.bos] : []), ...model.tokenize(prompt)];
console.log(`prompt_ids=${JSON.stringify(ids)}`);
console.log(`output_tokens=${sequence.tokenMeter.usedOutputTokens}`);
await context.dispose();
await model.dispose();
await llama.dispose();
