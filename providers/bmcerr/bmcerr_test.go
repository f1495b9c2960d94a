package bmcerr

import (
	"context"
	"errors"
	"fmt"
	"testing"
)

func TestClassSurvivesWrapping(t *testing.T) {
	cause := errors.New("401: Unauthorized")
	err := fmt.Errorf("via redfish at https://bmc: %w", WithCode(Credentials, 401, cause))
	if Of(err) != Credentials || !errors.Is(err, cause) {
		t.Fatalf("Of = %q, Is = %v", Of(err), errors.Is(err, cause))
	}
	if got, want := err.Error(), "via redfish at https://bmc: BMC refused the credentials (401): 401: Unauthorized"; got != want {
		t.Fatalf("Error() = %q, want %q", got, want)
	}
	// An error classified once keeps its class.
	if Of(New(Other, err)) != Credentials {
		t.Fatal("New reclassified a classified error")
	}
	if Of(nil) != "" || New(Busy, nil) != nil || Of(cause) != Other {
		t.Fatal("nil or unclassified errors misclassified")
	}
}

func TestWordingsDiffer(t *testing.T) {
	seen := map[string]Class{}
	for _, c := range Classes {
		w := c.Wording()
		if prev, ok := seen[w]; ok {
			t.Fatalf("%q and %q share the wording %q", prev, c, w)
		}
		seen[w] = c
	}
}

func TestTransport(t *testing.T) {
	if c := Transport(fmt.Errorf("x: %w", context.DeadlineExceeded)); c != Unreachable {
		t.Fatalf("deadline: %q", c)
	}
	if c := Transport(context.Canceled); c != Other {
		t.Fatalf("canceled: %q", c)
	}
}
