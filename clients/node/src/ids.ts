// The ids this client gives a turn-running call the caller left without them: a request id, and
// an id for each input message derived from it, so that repeating a failed call under the same
// request id re-sends the same message ids and the sidecar stores the input once
// (docs/semantics.md §11, "Idempotent input"). The Python and Go clients derive the same ids.

// Web Crypto (`globalThis.crypto`), in Node.js 20 and in browsers, so the browser entry shares
// this module; browsers offer it only in secure contexts (https://, or http://localhost).

/** An id the sidecar takes: 1-128 of `[A-Za-z0-9._:-]` (docs/semantics.md §11). */
const ID = /^[A-Za-z0-9._:-]{1,128}$/;

/** A request id for a call given none: `r-` and 32 hex digits (a UUID4), in the client's namespace (the sidecar's own start with `tw-`). */
export function newRequestId(): string {
  return `r-${crypto.randomUUID().replaceAll('-', '')}`;
}

/**
 * The id of input message `index` (from 0) of the turn `requestId` when the caller gave that
 * message none: `<requestId>.m<index>`, or `m<index>-` and the SHA-256 digest (hex) of the
 * request id when that is no valid id (over 128 characters; a request id the sidecar refuses).
 */
export async function inputMessageId(requestId: string, index: number): Promise<string> {
  const derived = `${requestId}.m${index}`;
  if (ID.test(derived)) return derived;
  const digest = new Uint8Array(await crypto.subtle.digest('SHA-256', new TextEncoder().encode(requestId)));
  return `m${index}-${Array.from(digest, (byte) => byte.toString(16).padStart(2, '0')).join('')}`;
}
