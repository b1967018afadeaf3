// The official `openai` npm SDK (6.x, unmodified: the newest major that runs on Node.js 20; 7.x
// needs Node.js 22) against the sidecar's OpenAI-compatible door. Run by
// tests/e2e/test_openai_door_e2e.py against its sidecar:
//
//   node tests/support/openai_node.mjs BASE_URL TOKEN
//
// It runs each scenario and prints one JSON object of what it saw; the Python test asserts on it.

import OpenAI from 'openai';

const [baseURL, apiKey] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0 });
const LOCATION = {
  type: 'function',
  name: 'get_location',
  description: "The user's location, from their device",
  parameters: { type: 'object', properties: { precision: { type: 'string' } } },
  strict: false,
};
const seen = {};

// responses.create, not streamed
const plain = await client.responses.create({ model: 'scripted:echo', conversation: 'node-plain', input: 'hi' });
seen.plain = { status: plain.status, text: plain.output_text, usage: plain.usage, conversation: plain.conversation };

// responses.create, streamed; then resumed after sequence number 4
const stream = await client.responses.create({ model: 'scripted:echo', conversation: 'node-stream', input: 'hi', stream: true });
const events = [];
for await (const event of stream) events.push(event);
seen.streamed = events.map((event) => [event.type, event.sequence_number]);
const responseId = events[0].response.id;
const resumed = await client.responses.retrieve(responseId, { stream: true, starting_after: 4 });
seen.resumed = [];
for await (const event of resumed) seen.resumed.push([event.type, event.sequence_number]);

// responses.stream: the helper that builds the response from the events
const helper = client.responses.stream({ model: 'scripted:echo', conversation: 'node-helper', input: 'hi' });
let deltas = '';
helper.on('response.output_text.delta', (event) => { deltas += event.delta; });
const final = await helper.finalResponse();
// (the Node helper's final response has no output_text without a text format: read the items)
const finalText = final.output.filter((item) => item.type === 'message')
  .flatMap((item) => item.content).map((part) => part.text).join('');
seen.helper = { deltas, text: finalText, status: final.status };

// a client tool round trip with function_call_output
const asked = await client.responses.create({
  model: 'scripted:locate', conversation: 'node-tools', input: 'Where am I?', tools: [LOCATION],
});
const call = asked.output.find((item) => item.type === 'function_call');
const answered = await client.responses.create({
  model: 'scripted:thanks',
  previous_response_id: asked.id,
  tools: [LOCATION],
  input: [{ type: 'function_call_output', call_id: call.call_id, output: '{"city": "Paris"}' }],
});
seen.tools = { name: call.name, arguments: JSON.parse(call.arguments), answer: answered.output_text };

// chat.completions.create with tools
const chatTool = { type: 'function', function: { name: LOCATION.name, description: LOCATION.description, parameters: LOCATION.parameters } };
const messages = [{ role: 'user', content: 'Where am I?' }];
const first = await client.chat.completions.create({ model: 'scripted:locate', messages, tools: [chatTool] });
const toolCall = first.choices[0].message.tool_calls[0];
const second = await client.chat.completions.create({
  model: 'scripted:thanks',
  tools: [chatTool],
  messages: [...messages, first.choices[0].message, { role: 'tool', tool_call_id: toolCall.id, content: '{"city": "Paris"}' }],
});
seen.chat = {
  finish: first.choices[0].finish_reason,
  name: toolCall.function.name,
  answer: second.choices[0].message.content,
};

// an error in OpenAI's shape, raised as the SDK's own class
try {
  await client.responses.create({ input: 'hi', conversation: 'bad id!' });
  seen.error = null;
} catch (error) {
  seen.error = { class: error.constructor.name, status: error.status, param: error.param, code: error.code };
}

process.stdout.write(JSON.stringify(seen));
