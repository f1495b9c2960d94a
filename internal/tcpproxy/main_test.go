package tcpproxy

import (
	"testing"

	"go.uber.org/goleak"
)

// Every copier and acceptor of a closed proxy must be gone.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
