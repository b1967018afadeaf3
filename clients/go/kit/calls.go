package kit

import (
	"context"

	"google.golang.org/grpc/metadata"
)

// ParentRequestMetadata is the metadata key of the turn's request id on every
// call the sidecar makes (docs/semantics.md §5): forward it when a hook or a
// tool calls back into the sidecar, so that the nesting rule applies.
const ParentRequestMetadata = "turnwire-parent-request-id"

// traceKeys are the W3C trace context's metadata keys.
var traceKeys = []string{"traceparent", "tracestate"}

// Info is what a hook or tool call carries besides its request.
type Info struct {
	// ParentRequestID is the turn's request id (ParentRequestMetadata).
	ParentRequestID string
	// TraceContext is the call's W3C trace context (traceparent, tracestate;
	// empty when the sidecar does not trace): extract it to continue the
	// turn's trace.
	TraceContext map[string]string
	// Metadata is the call's gRPC metadata (on HookSession: the stream's,
	// with the call's own trace context).
	Metadata metadata.MD
}

// CallInfo is the Info of the call whose handler or tool got ctx (empty
// outside one). To call back into the sidecar on the call's behalf:
//
//	ctx = metadata.AppendToOutgoingContext(ctx, kit.ParentRequestMetadata, kit.CallInfo(ctx).ParentRequestID)
func CallInfo(ctx context.Context) Info {
	md, _ := metadata.FromIncomingContext(ctx)
	info := Info{TraceContext: map[string]string{}, Metadata: md}
	if values := md.Get(ParentRequestMetadata); len(values) > 0 {
		info.ParentRequestID = values[0]
	}
	for _, key := range traceKeys {
		if values := md.Get(key); len(values) > 0 {
			info.TraceContext[key] = values[0]
		}
	}
	return info
}
