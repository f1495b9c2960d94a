package ipmi

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/bougou/go-ipmi/pkg/types"

	"github.com/shepherd-fleet/shepherd/internal/ipmisimtest"
	"github.com/shepherd-fleet/shepherd/providers/bmcerr"
)

// Through a real BMC (ipmi_sim): a wrong password is refused credentials,
// for a power read and an action; a BMC that does not answer is
// unreachable.
func TestClassifiedFailures(t *testing.T) {
	t.Parallel()
	sim := ipmisimtest.Start(t)
	c := New(DefaultConfig())
	ctx := context.Background()
	wrong := simTarget(t, sim, "not-the-password")
	_, err := c.PowerStatus(ctx, wrong)
	if bmcerr.Of(err) != bmcerr.Credentials || !strings.HasPrefix(err.Error(), "BMC refused the credentials: ipmi") {
		t.Fatalf("PowerStatus with a wrong password: %v (class %q), want the credentials refused", err, bmcerr.Of(err))
	}
	if _, _, err := c.Recover(ctx, wrong); bmcerr.Of(err) != bmcerr.Credentials {
		t.Fatalf("Recover with a wrong password: %v, want the credentials refused", err)
	}

	silent, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	target := Target{Address: "127.0.0.1", Port: silent.LocalAddr().(*net.UDPAddr).Port, CredentialsFile: wrong.CredentialsFile}
	// A short timeout: the silent socket costs all of it.
	if err := New(Config{Timeout: time.Second}).PowerOn(ctx, target); bmcerr.Of(err) != bmcerr.Unreachable || !strings.HasPrefix(err.Error(), "BMC unreachable: ") {
		t.Fatalf("silent BMC: %v (class %q), want unreachable", err, bmcerr.Of(err))
	}

	target.CredentialsFile = t.TempDir() + "/missing"
	if err := c.Reset(ctx, target); bmcerr.Of(err) != bmcerr.Configuration {
		t.Fatalf("missing credentials file: %v (class %q), want a configuration error", err, bmcerr.Of(err))
	}
}

// The library's refusals, whole or as the text it joins them into.
func TestClassOfLibraryErrors(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bmcerr.Class
	}{
		{types.NewResponseError(types.CodeNodeBusy, "Node busy"), bmcerr.Busy},
		{fmt.Errorf("chassis control: %w", types.NewResponseError(types.CodeInsufficientPrivilege, "x")), bmcerr.Credentials},
		{types.NewRmcpStatusError(types.RmcpStatusCodeUnauthorizedName), bmcerr.Credentials},
		{fmt.Errorf("connect20 failed, errs: \n%v", errors.Join(types.NewRmcpStatusError(types.RmcpStatusCodeNoResToCreateSess))), bmcerr.Busy},
		{fmt.Errorf("errs: %v", types.NewRmcpStatusError(types.RmcpStatusCodeNoCipherSuiteMatch)), bmcerr.Configuration},
		{fmt.Errorf("x: %v", types.NewResponseError(types.CodeNodeBusy, "Node busy")), bmcerr.Busy},
		{errors.New("logging in: IPMI LAN: no matching IPMI response before UDP read deadline after 1 attempt(s)"), bmcerr.Unreachable},
		{errMalformed, bmcerr.Other},
	} {
		if got := classOf(tc.err); got != tc.want {
			t.Errorf("classOf(%v) = %q, want %q", tc.err, got, tc.want)
		}
	}
}
