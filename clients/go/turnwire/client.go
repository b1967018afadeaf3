package turnwire

import (
	"context"

	"google.golang.org/grpc"

	turnwirev1 "turnwire.dev/go/gen/turnwire/v1"
)

// Client is a connection to a Turnwire sidecar. It is safe for concurrent
// use; Close it when done.
type Client struct {
	conn    *grpc.ClientConn
	service turnwirev1.ChatServiceClient

	// IncludeProgress lets the Streams of later calls yield Progress
	// keepalives: events holding a Progress, with sequence number 0, that a
	// turn's stream sends while silent for limits.progress_interval_seconds
	// (not part of the turn's stream). False (the default) skips them. Set it
	// before the calls.
	IncludeProgress bool
}

// Dial connects to the sidecar at addr ("host:port", or any gRPC target such
// as "unix:///run/turnwire.sock") and returns once the connection is up. It
// fails at once when nothing listens there (connection refused: retry Dial
// to wait for a sidecar that is still starting), and when ctx ends first;
// ctx bounds only the dial.
//
// opts are gRPC-Go dial options; one of them must choose the transport
// security, as gRPC-Go requires: grpc.WithInsecure() for a plaintext
// sidecar, grpc.WithTransportCredentials(credentials.NewTLS(cfg)) for TLS.
// Errors of every call on the connection are *Error (see Error). A Dial that
// fails because its TLS does not match the sidecar's (plaintext to a TLS
// sidecar, no client certificate for a mutual-TLS one, TLS to a plaintext
// one) returns a *TLSMismatchError saying what the sidecar wants.
func Dial(ctx context.Context, addr string, opts ...grpc.DialOption) (*Client, error) {
	said := &spoken{}
	// First, so that a dialer of the caller's replaces it.
	if recorder := recordingDialer(addr, said); recorder != nil {
		opts = append([]grpc.DialOption{recorder}, opts...)
	}
	opts = append(opts,
		grpc.WithBlock(),
		grpc.FailOnNonTempDialError(true),
		grpc.WithChainUnaryInterceptor(unaryErrors),
		grpc.WithChainStreamInterceptor(streamErrors),
	)
	conn, err := grpc.DialContext(ctx, addr, opts...)
	if err != nil {
		return nil, explainDial(addr, said, err)
	}
	return &Client{conn: conn, service: turnwirev1.NewChatServiceClient(conn)}, nil
}

// Close closes the connection; calls in flight end with codes.Canceled.
func (c *Client) Close() error {
	return c.conn.Close()
}

// Conn is the underlying connection, e.g. for the health service
// (grpc.health.v1) or turnwire.v1.ToolService clients.
func (c *Client) Conn() *grpc.ClientConn {
	return c.conn
}

// Service is the generated ChatService client on this connection, for the
// RPCs this package does not wrap (GetConversation, ListConversations,
// CancelChat, SubmitMessages with its Webhook target, ListWebhookDeliveries,
// ...). Its errors are *Error too.
func (c *Client) Service() turnwirev1.ChatServiceClient {
	return c.service
}

// Chat appends req.Message to the conversation req.ConversationId (created
// on first use) and runs a turn; the Stream yields its events, the last a
// TurnEnd. Cancelling ctx, or Stream.Close, cancels the call.
// req.ConcurrentInputStrategy says what the message does when the
// conversation has a turn running or queued (ENQUEUE, REJECT, INTERRUPT,
// ROLLBACK; unset: the server's limits.concurrent_input); SaveMessages,
// SubmitToolResults and SubmitToolApprovals take it too.
//
// Chat fills in what req leaves empty: req.RequestId (NewRequestID) and
// req.Message.Id (InputMessageID of the request id), so that calling Chat
// again with the same req after the turn failed (TurnEnd ERROR, a lost
// connection) retries that turn and the sidecar stores the message once
// (docs/semantics.md §11). A new question needs a new request (or a new
// RequestId).
func (c *Client) Chat(ctx context.Context, req *turnwirev1.ChatRequest, opts ...grpc.CallOption) (*Stream, error) {
	if req.RequestId == "" {
		req.RequestId = NewRequestID()
	}
	if req.Message != nil && req.Message.Id == "" {
		req.Message.Id = InputMessageID(req.RequestId, 0)
	}
	ctx, cancel := streamContext(ctx)
	call, err := c.service.Chat(ctx, req, opts...)
	return c.openStream(cancel, err, func() (eventResponse, error) { return call.Recv() })
}

// SaveMessages appends req.Messages (possibly none) and runs a turn on the
// resulting history; see Chat. It fills in req.RequestId and the id of each
// message without one (InputMessageID of the request id and its index).
func (c *Client) SaveMessages(ctx context.Context, req *turnwirev1.SaveMessagesRequest, opts ...grpc.CallOption) (*Stream, error) {
	if req.RequestId == "" {
		req.RequestId = NewRequestID()
	}
	for index, message := range req.Messages {
		if message.Id == "" {
			message.Id = InputMessageID(req.RequestId, index)
		}
	}
	ctx, cancel := streamContext(ctx)
	call, err := c.service.SaveMessages(ctx, req, opts...)
	return c.openStream(cancel, err, func() (eventResponse, error) { return call.Recv() })
}

// ContinueLastTurn lets the model continue after the last assistant message;
// see Chat (req.RequestId is filled in when empty).
func (c *Client) ContinueLastTurn(ctx context.Context, req *turnwirev1.ContinueLastTurnRequest, opts ...grpc.CallOption) (*Stream, error) {
	if req.RequestId == "" {
		req.RequestId = NewRequestID()
	}
	ctx, cancel := streamContext(ctx)
	call, err := c.service.ContinueLastTurn(ctx, req, opts...)
	return c.openStream(cancel, err, func() (eventResponse, error) { return call.Recv() })
}

// ResumeTurn re-attaches to the turn req.RequestId: its events after
// req.AfterSequenceNumber, then the live ones until its TurnEnd. Cancelling
// it never cancels the turn.
func (c *Client) ResumeTurn(ctx context.Context, req *turnwirev1.ResumeTurnRequest, opts ...grpc.CallOption) (*Stream, error) {
	ctx, cancel := streamContext(ctx)
	call, err := c.service.ResumeTurn(ctx, req, opts...)
	return c.openStream(cancel, err, func() (eventResponse, error) { return call.Recv() })
}

// SubmitToolResults stores the results of client-side tool calls; once every
// pending call of the message has a result, the continuation turn streams
// here (the model goes on), as in the Python and TypeScript clients. With
// WithoutAutoContinue among opts the results are only stored and the stream
// is one TurnEnd (TURN_STATUS_SKIPPED); run the turn later with
// ContinueLastTurn. This sets req.AutoContinue accordingly (a plain proto3
// bool cannot say "unset", so the option, not the field, decides) and fills
// in req.RequestId when empty.
func (c *Client) SubmitToolResults(ctx context.Context, req *turnwirev1.SubmitToolResultsRequest, opts ...grpc.CallOption) (*Stream, error) {
	if req.RequestId == "" {
		req.RequestId = NewRequestID()
	}
	req.AutoContinue, opts = autoContinue(opts)
	ctx, cancel := streamContext(ctx)
	call, err := c.service.SubmitToolResults(ctx, req, opts...)
	return c.openStream(cancel, err, func() (eventResponse, error) { return call.Recv() })
}

// SubmitToolApprovals approves or denies tool calls waiting for approval,
// then continues as SubmitToolResults: once every waiting call is answered
// the approved calls run and the model goes on in this stream, unless opts
// hold WithoutAutoContinue (req.AutoContinue is set accordingly;
// req.RequestId is filled in when empty).
func (c *Client) SubmitToolApprovals(ctx context.Context, req *turnwirev1.SubmitToolApprovalsRequest, opts ...grpc.CallOption) (*Stream, error) {
	if req.RequestId == "" {
		req.RequestId = NewRequestID()
	}
	req.AutoContinue, opts = autoContinue(opts)
	ctx, cancel := streamContext(ctx)
	call, err := c.service.SubmitToolApprovals(ctx, req, opts...)
	return c.openStream(cancel, err, func() (eventResponse, error) { return call.Recv() })
}

// WithoutAutoContinue is a call option of SubmitToolResults and
// SubmitToolApprovals: store the answers without running the continuation
// turn (auto_continue false). Without it they continue, the default of every
// Turnwire client. Other calls ignore it.
func WithoutAutoContinue() grpc.CallOption {
	return withoutAutoContinue{}
}

// withoutAutoContinue carries WithoutAutoContinue among gRPC call options
// (grpc.EmptyCallOption: gRPC itself ignores it).
type withoutAutoContinue struct{ grpc.EmptyCallOption }

// autoContinue is whether a tool answer call continues (no
// WithoutAutoContinue in opts) and opts without that option.
func autoContinue(opts []grpc.CallOption) (bool, []grpc.CallOption) {
	kept := make([]grpc.CallOption, 0, len(opts))
	continues := true
	for _, opt := range opts {
		if _, off := opt.(withoutAutoContinue); off {
			continues = false
			continue
		}
		kept = append(kept, opt)
	}
	return continues, kept
}

// WatchSubmission streams the turn of a submission once it runs (events
// after req.AfterSequenceNumber), then its TurnEnd.
func (c *Client) WatchSubmission(ctx context.Context, req *turnwirev1.WatchSubmissionRequest, opts ...grpc.CallOption) (*Stream, error) {
	ctx, cancel := streamContext(ctx)
	call, err := c.service.WatchSubmission(ctx, req, opts...)
	return c.openStream(cancel, err, func() (eventResponse, error) { return call.Recv() })
}

// unaryErrors returns the errors of unary calls as *Error.
func unaryErrors(ctx context.Context, method string, req, reply interface{}, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	return fromCall(invoker(ctx, method, req, reply, cc, opts...))
}

// streamErrors returns the errors of streaming calls as *Error: at the start
// and from RecvMsg (io.EOF, the clean end, stays io.EOF).
func streamErrors(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	stream, err := streamer(ctx, desc, cc, method, opts...)
	if err != nil {
		return nil, fromCall(err)
	}
	return errorStream{stream}, nil
}

type errorStream struct{ grpc.ClientStream }

func (s errorStream) RecvMsg(m interface{}) error {
	return fromCall(s.ClientStream.RecvMsg(m))
}

func (s errorStream) SendMsg(m interface{}) error {
	return fromCall(s.ClientStream.SendMsg(m))
}
