// A call the sidecar ends without an answer must fail, not wait forever. When a request is larger
// than the sidecar's `limits.max_receive_message_bytes`, the sidecar stops reading it and may close
// the call's HTTP/2 stream with RST_STREAM NO_ERROR before the client saw any response headers
// (the trailers carrying RESOURCE_EXHAUSTED are lost with the unread request). connect-node treats
// NO_ERROR as no error, so the call would hang (issue 32 item 14). This session manager fails such a
// stream instead: RESOURCE_EXHAUSTED when part of the request was never sent, UNAVAILABLE otherwise.

import http2 from 'node:http2';

import { Code, ConnectError } from '@connectrpc/connect';
import { Http2SessionManager } from '@connectrpc/connect-node';

/** {@link Http2SessionManager} whose streams fail when the server closes one without answering. */
export class AnsweredSessionManager extends Http2SessionManager {
  override async request(
    method: string,
    path: string,
    headers: http2.OutgoingHttpHeaders,
    options: Omit<http2.ClientSessionRequestOptions, 'signal'>,
  ): Promise<http2.ClientHttp2Stream> {
    const stream = await super.request(method, path, headers, options);
    let answered = false;
    stream.once('response', () => {
      answered = true;
    });
    // Node.js emits 'aborted' when the server closes the stream while the request is still being
    // written; with NO_ERROR and no response it emits nothing else (its 'close' waits for the
    // unread response body to be read, which connect-node starts only on a response).
    stream.once('aborted', () => {
      if (answered || stream.rstCode !== http2.constants.NGHTTP2_NO_ERROR) return;
      if (stream.listenerCount('error') > 0) stream.emit('error', unanswered(!stream.writableFinished));
      // The sidecar refuses the connection's next stream (ENHANCE_YOUR_CALM) after this: later calls
      // go on a new connection, the calls running on this one finish on it.
      const session = stream.session;
      stream.destroy(); // its unsent request goes
      if (session) this.retire(session);
    });
    return stream;
  }

  /** Connections closed for new calls, still finishing their running ones (see `retire`). */
  private readonly retired = new Set<http2.Http2Session>();

  /** Closes every connection, the retired ones too; calls still running on them fail. */
  override abort(reason?: Error): void {
    for (const session of this.retired) session.destroy();
    this.retired.clear();
    super.abort(reason);
  }

  /** Lets `session` finish its running calls, and send no new ones: the manager opens a new connection. */
  private retire(session: http2.Http2Session): void {
    if (session.closed) return;
    this.retired.add(session);
    session.once('close', () => this.retired.delete(session));
    session.close();
  }
}

/** The error of a call the server closed before answering; `cutShort`: part of the request was never sent. */
function unanswered(cutShort: boolean): ConnectError {
  if (cutShort) {
    return new ConnectError(
      'the sidecar closed the call before reading the whole request, without a status: the request ' +
        'is larger than the sidecar accepts (its limits.max_receive_message_bytes); send less, or set ' +
        "this client's maxSendMessageBytes to the sidecar's limit to be told before sending",
      Code.ResourceExhausted,
    );
  }
  return new ConnectError('the sidecar closed the call without answering', Code.Unavailable);
}
