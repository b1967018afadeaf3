package turnwire_test

import (
	"context"
	"reflect"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	turnwirev1 "turnwire.dev/go/gen/turnwire/v1"
	"turnwire.dev/go/turnwire"
)

// batchCounter is a stream interceptor that records whether calls asked for
// event batches and how many events arrived in MoreEvents.
type batchCounter struct {
	asked   bool
	batched int
}

type countingStream struct {
	grpc.ClientStream
	counter *batchCounter
}

func (s countingStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if response, ok := m.(interface {
		GetMoreEvents() []*turnwirev1.TurnEvent
	}); ok && err == nil {
		s.counter.batched += len(response.GetMoreEvents())
	}
	return err
}

func (c *batchCounter) intercept(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	md, _ := metadata.FromOutgoingContext(ctx)
	c.asked = reflect.DeepEqual(md.Get(turnwire.EventBatchesMetadata), []string{"1"})
	stream, err := streamer(ctx, desc, cc, method, opts...)
	return countingStream{stream, c}, err
}

// A Stream asks for event batches (docs/semantics.md §10) and hands out the
// batched events one by one, numbered without a gap, as ResumeTurn replays
// them one a message.
func TestStreamsReadEventBatches(t *testing.T) {
	ctx := testContext(t)
	counter := &batchCounter{}
	batching, err := turnwire.Dial(ctx, server.Addr, grpc.WithInsecure(), grpc.WithChainStreamInterceptor(counter.intercept))
	if err != nil {
		t.Fatal(err)
	}
	defer batching.Close()
	stream, err := batching.Chat(ctx, &turnwirev1.ChatRequest{
		ConversationId: "go-batches",
		Message:        turnwire.UserText("What's the weather in Paris?"),
	})
	if err != nil {
		t.Fatal(err)
	}
	events := collect(t, stream)
	if !counter.asked {
		t.Fatalf("the Chat call did not send %s: 1", turnwire.EventBatchesMetadata)
	}
	if counter.batched == 0 {
		t.Fatalf("no event arrived in a batch (%d events); the demo model's chunks come at once", len(events))
	}
	var kinds []string
	for i, event := range events {
		if event.GetSequenceNumber() != int64(i+1) {
			t.Fatalf("event %d has sequence number %d; want 1..N without gaps", i, event.GetSequenceNumber())
		}
		kinds = append(kinds, reflect.TypeOf(event.GetEvent()).String())
	}
	resumed, err := client.ResumeTurn(ctx, &turnwirev1.ResumeTurnRequest{RequestId: events[0].GetRequestId()})
	if err != nil {
		t.Fatal(err)
	}
	var replayed []string
	for _, event := range collect(t, resumed) {
		replayed = append(replayed, reflect.TypeOf(event.GetEvent()).String())
	}
	if !reflect.DeepEqual(kinds, replayed) {
		t.Fatalf("the turn's events %v; ResumeTurn replayed %v", kinds, replayed)
	}
}
