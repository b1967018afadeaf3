package kit_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"

	turnwirev1 "turnwire.dev/go/gen/turnwire/v1"
)

// docsProgram matches the first Go block of docs/api/kit-go.md: the program
// users copy.
var docsProgram = regexp.MustCompile("(?s)```go\n(package main\n.*?)```")

// docsAddress is the address the docs program serves on.
const docsAddress = "127.0.0.1:7001"

// startDocsProgram builds docs/api/kit-go.md's program in dir, starts it on a
// free port instead of docsAddress and waits until it answers ListTools;
// stop ends it.
func startDocsProgram(dir string) (address string, stop func(), err error) {
	// The test runs in the package's folder, which tools/go-test.sh reaches
	// through a link into a scratch GOPATH: the repository is where it points.
	here, err := os.Getwd()
	if err != nil {
		return "", nil, err
	}
	if here, err = filepath.EvalSymlinks(here); err != nil {
		return "", nil, err
	}
	page, err := os.ReadFile(filepath.Join(here, "..", "..", "..", "docs", "api", "kit-go.md"))
	if err != nil {
		return "", nil, err
	}
	match := docsProgram.FindSubmatch(page)
	if match == nil || !strings.Contains(string(match[1]), `"`+docsAddress+`"`) {
		return "", nil, fmt.Errorf("docs/api/kit-go.md has no ```go program serving on %s", docsAddress)
	}
	source := filepath.Join(dir, "docs_program.go")
	binary := filepath.Join(dir, "docs_program")
	// A port free a moment ago may be taken by the time the program binds it:
	// then it exits, and another port is tried.
	for attempt := 0; attempt < 3; attempt++ {
		listener, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return "", nil, err
		}
		address = listener.Addr().String()
		listener.Close()
		program := exec.Command(binary)
		program.Stderr = os.Stderr
		// The program reads its address from its source: rebuild with this one.
		replaced := strings.Replace(string(match[1]), `"`+docsAddress+`"`, `"`+address+`"`, 1)
		if err := os.WriteFile(source, []byte(replaced), 0o600); err != nil {
			return "", nil, err
		}
		if out, err := exec.Command("go", "build", "-o", binary, source).CombinedOutput(); err != nil {
			return "", nil, fmt.Errorf("go build the docs program: %v\n%s", err, out)
		}
		if err := program.Start(); err != nil {
			return "", nil, err
		}
		exited := make(chan error, 1)
		go func() { exited <- program.Wait() }()
		stop = func() {
			_ = program.Process.Signal(os.Interrupt)
			select {
			case <-exited:
			case <-time.After(10 * time.Second):
				_ = program.Process.Kill()
				<-exited
			}
		}
		if err := waitListening(address, exited); err == nil {
			return address, stop, nil
		} else if !errors.Is(err, errExited) {
			stop()
			return "", nil, err
		}
	}
	return "", nil, errors.New("the docs program did not start on any of 3 ports")
}

var errExited = errors.New("the program exited")

// waitListening waits until a tool host at address answers ListTools.
func waitListening(address string, exited <-chan error) error {
	conn, err := grpc.Dial(address, grpc.WithInsecure())
	if err != nil {
		return err
	}
	defer conn.Close()
	client := turnwirev1.NewToolExecutorServiceClient(conn)
	deadline := time.Now().Add(callTimeout)
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			return errExited
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		_, err := client.ListTools(ctx, &turnwirev1.ListToolsRequest{}, grpc.WaitForReady(true))
		cancel()
		if err == nil {
			return nil
		}
	}
	return fmt.Errorf("the docs program did not answer ListTools within %s", callTimeout)
}

func TestDocsProgramsToolAndPolicyHook(t *testing.T) {
	// The sidecar calls its hooks with unary RPCs (hook_session: false, run).
	got := outputs(chat(t, "kit-docs-1", "kit-docs-stock"))
	want := []string{`{"status":"counting"} (preliminary)`, `{"sku":"A-1","units":3} (preliminary)`, `{"sku":"A-1","units":3}`}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("lookup_stock: %v; want %v", got, want)
	}
	got = outputs(chat(t, "kit-docs-2", "kit-docs-internal"))
	if len(got) != 1 || !strings.Contains(got[0], "internal SKUs are not for customers") || !strings.HasSuffix(got[0], "BLOCKED") {
		t.Errorf("lookup_stock of an internal SKU: %v; want the policy's block", got)
	}
	// Its BeforeTurn (a *string field, set with proto.String) added its line
	// to the system prompt of every step.
	systems := systemPrompts(t, "kit-docs-stock")
	if len(systems) != 2 || !strings.HasSuffix(systems[0], "\nAnswer in English.") || systems[1] != systems[0] {
		t.Errorf("the model's system prompts %q; want the docs program's line on both steps", systems)
	}
}
