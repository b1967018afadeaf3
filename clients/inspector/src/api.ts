// The sidecar's API as the page calls it: Connect's JSON protocol over fetch, the bearer token in
// the authorization header (docs/api/http.md). Unary calls are a POST of JSON; server streams
// (ResumeTurn) are enveloped JSON messages read as they arrive.

export type Json = Record<string, any>;

const SERVICE = '/turnwire.v1.ChatService/';

export class ApiError extends Error {
  constructor(
    readonly code: string,
    message: string,
  ) {
    super(message);
  }
}

export class Api {
  constructor(private readonly token: string) {}

  private headers(contentType: string): HeadersInit {
    const headers: Record<string, string> = { 'content-type': contentType, 'connect-protocol-version': '1' };
    if (this.token) headers.authorization = `Bearer ${this.token}`;
    return headers;
  }

  async call(method: string, request: Json): Promise<Json> {
    const response = await fetch(SERVICE + method, {
      method: 'POST',
      headers: this.headers('application/json'),
      body: JSON.stringify(request),
    });
    const text = await response.text();
    const body = text ? JSON.parse(text) : {};
    if (!response.ok) throw new ApiError(body.code ?? String(response.status), body.message ?? text);
    return body;
  }

  // Each message of a server stream, as it arrives; ends at the stream's end, throws its error.
  async *stream(method: string, request: Json, signal?: AbortSignal): AsyncGenerator<Json> {
    const payload = new TextEncoder().encode(JSON.stringify(request));
    const envelope = new Uint8Array(5 + payload.length);
    new DataView(envelope.buffer).setUint32(1, payload.length);
    envelope.set(payload, 5);
    const response = await fetch(SERVICE + method, {
      method: 'POST',
      headers: this.headers('application/connect+json'),
      body: envelope,
      signal,
    });
    if (!response.ok || !response.body) {
      const body = await response.json().catch(() => ({}));
      throw new ApiError(body.code ?? String(response.status), body.message ?? response.statusText);
    }
    const reader = response.body.getReader();
    let buffer = new Uint8Array(0);
    for (;;) {
      const { done, value } = await reader.read();
      if (value) {
        const joined = new Uint8Array(buffer.length + value.length);
        joined.set(buffer);
        joined.set(value, buffer.length);
        buffer = joined;
      }
      while (buffer.length >= 5) {
        const view = new DataView(buffer.buffer, buffer.byteOffset);
        const flags = view.getUint8(0);
        const length = view.getUint32(1);
        if (buffer.length < 5 + length) break;
        const message = JSON.parse(new TextDecoder().decode(buffer.subarray(5, 5 + length)));
        buffer = buffer.slice(5 + length);
        if (flags & 0x02) {
          if (message.error) throw new ApiError(message.error.code, message.error.message ?? '');
          return;
        }
        yield message;
      }
      if (done) return;
    }
  }
}
