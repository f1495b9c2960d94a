package redfish

import (
	"errors"
	"fmt"
	"io"
	"net/http"
)

// Bounds on what a BMC's answer may cost. gofish reads every body whole and
// puts the body of a non-2xx answer into its error, which is logged, stored
// with the failure and rendered on the status page: a BMC (broken, or
// hostile) answering 500 with 100 MiB would otherwise take the daemon's
// memory, logs and pages with it.
const (
	// maxBody bounds a successful answer: Redfish resources are a few KiB.
	maxBody = 1 << 20
	// maxErrorBody bounds the body of an error answer, which only ever
	// serves as a message.
	maxErrorBody = 4 << 10
)

// boundedTransport cuts every response body to maxBody, or maxErrorBody
// for error statuses; what is cut is never read from the network.
type boundedTransport struct{ next http.RoundTripper }

func (t boundedTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.next.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	limit := int64(maxBody)
	if resp.StatusCode >= 300 {
		limit = maxErrorBody
	}
	resp.Body = &boundedBody{body: resp.Body, left: limit, limit: limit}
	return resp, nil
}

// boundedBody is an io.ReadCloser that ends after limit bytes of body,
// followed, when the body had more, by a line saying it was cut.
type boundedBody struct {
	body        io.ReadCloser
	left, limit int64
	// mark is what remains to be read of the cut line once the limit is
	// reached; ended is set when nothing more will be read.
	mark  []byte
	ended bool
}

func (b *boundedBody) Read(p []byte) (int, error) {
	if b.left > 0 {
		n, err := b.body.Read(p[:min(int64(len(p)), b.left)])
		b.left -= int64(n)
		return n, err
	}
	if !b.ended && b.mark == nil {
		// At the limit: one more byte tells a body that ended there from
		// one that was cut.
		var one [1]byte
		if n, _ := io.ReadFull(b.body, one[:]); n == 0 {
			b.ended = true
		} else {
			b.mark = fmt.Appendf(nil, "\n[answer cut after %d bytes]", b.limit)
		}
	}
	if b.ended || len(b.mark) == 0 {
		b.ended = true
		return 0, io.EOF
	}
	n := copy(p, b.mark)
	b.mark = b.mark[n:]
	return n, nil
}

func (b *boundedBody) Close() error { return b.body.Close() }

// checkRedirect refuses a redirect that changes scheme or host: the
// request carries the BMC's credentials (HTTP Basic), and Go forwards them
// on a redirect within one host, even from https to http.
func checkRedirect(req *http.Request, via []*http.Request) error {
	if len(via) >= 5 {
		return errors.New("stopped after 5 redirects")
	}
	first := via[0].URL
	if req.URL.Scheme != first.Scheme || req.URL.Host != first.Host {
		return fmt.Errorf("refusing a redirect from %s://%s to %s://%s: the BMC's credentials go only where the inventory says", first.Scheme, first.Host, req.URL.Scheme, req.URL.Host)
	}
	return nil
}
