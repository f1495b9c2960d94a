package redfish

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
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

// Bounds on one action's whole conversation with a BMC. Each answer is
// bounded by maxBody, but gofish follows Members@odata.nextLink page after
// page and keeps every member: a BMC serving an endless collection, one
// bounded page at a time, would take all memory. A reset needs about five
// requests and some tens of KiB; the bounds leave room for a BMC managing
// a few dozen systems, and cut off anything beyond.
const (
	maxRequests   = 32
	maxTotalBytes = 4 << 20
)

// conversation is the transport of one action: it sends requests only to
// the action's endpoint, at most maxRequests of them, reads at most
// maxTotalBytes of answers in all and each answer cut to maxBody (or
// maxErrorBody). A new one is made for every action, so that one BMC's
// conversation never counts against another's.
type conversation struct {
	next http.RoundTripper
	// scheme and host are the endpoint's, which every request must have.
	scheme, host string

	requests atomic.Int64
	bytes    atomic.Int64
	// exceeded holds the error of the first bound exceeded, if any.
	exceeded atomic.Pointer[error]
	// redirect is the path the last redirect within the endpoint led to.
	redirect atomic.Pointer[string]
}

func newConversation(next http.RoundTripper, endpoint *url.URL) *conversation {
	return &conversation{next: next, scheme: endpoint.Scheme, host: endpoint.Host}
}

// RoundTrip checks req's destination and the request bound before sending
// it. gofish builds every URL as the endpoint followed by a link from the
// BMC's answers, so a link such as "@other-host/x" or ".example.org/x"
// would otherwise send the BMC's credentials (HTTP Basic, in every
// request) to another host.
func (c *conversation) RoundTrip(req *http.Request) (*http.Response, error) {
	u := req.URL
	if u.User != nil || !strings.EqualFold(u.Scheme, c.scheme) || !strings.EqualFold(u.Host, c.host) {
		closeBody(req)
		// Neither the user information nor the path is named: the former
		// is made up by the BMC, the latter does not help find which BMC
		// did it.
		return nil, fmt.Errorf("%w: a link of the BMC leads to %s://%s, and the BMC's credentials go only to %s://%s", ErrForeignHost, u.Scheme, u.Host, c.scheme, c.host)
	}
	if n := c.requests.Add(1); n > maxRequests {
		closeBody(req)
		return nil, c.exceed(fmt.Errorf("%w %d requests", ErrConversationBound, maxRequests))
	}
	resp, err := c.next.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	limit := int64(maxBody)
	if resp.StatusCode >= 300 {
		limit = maxErrorBody
	}
	resp.Body = &boundedBody{body: resp.Body, left: limit, limit: limit, conv: c}
	return resp, nil
}

// closeBody closes the body of a request refused: a RoundTripper closes
// it whatever the outcome.
func closeBody(req *http.Request) {
	if req.Body != nil {
		req.Body.Close()
	}
}

// exceed records err as the bound exceeded, unless one already was, and
// returns the one recorded.
func (c *conversation) exceed(err error) error {
	c.exceeded.CompareAndSwap(nil, &err)
	return *c.exceeded.Load()
}

// cause is the error to report for err, an action's failure: the bound
// exceeded, if one was, in place of err, which is then only a consequence
// (and, from gofish's walk of a collection, may list every member it
// could not fetch); else err, with the context's error preferred.
func (c *conversation) cause(ctx context.Context, err error) error {
	if e := c.exceeded.Load(); e != nil {
		return *e
	}
	return contextError(ctx, err)
}

// boundedBody is an io.ReadCloser that ends after limit bytes of body,
// followed, when the body had more, by a line saying it was cut; and that
// fails once its conversation read maxTotalBytes.
type boundedBody struct {
	body        io.ReadCloser
	left, limit int64
	conv        *conversation
	// mark is what remains to be read of the cut line once the limit is
	// reached; ended is set when nothing more will be read.
	mark  []byte
	ended bool
}

func (b *boundedBody) Read(p []byte) (int, error) {
	if b.left > 0 {
		total := maxTotalBytes - b.conv.bytes.Load()
		if total <= 0 {
			return 0, b.conv.exceed(fmt.Errorf("%w %d bytes", ErrConversationBound, maxTotalBytes))
		}
		n, err := b.body.Read(p[:min(int64(len(p)), b.left, total)])
		b.left -= int64(n)
		b.conv.bytes.Add(int64(n))
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
// on a redirect within one host, even from https to http. It records
// where a redirect within the endpoint led (see redirectedTo).
func (c *conversation) checkRedirect(req *http.Request, via []*http.Request) error {
	if len(via) >= 5 {
		return errors.New("stopped after 5 redirects")
	}
	first := via[0].URL
	if req.URL.Scheme != first.Scheme || req.URL.Host != first.Host {
		return fmt.Errorf("refusing a redirect from %s://%s to %s://%s: the BMC's credentials go only where the inventory says", first.Scheme, first.Host, req.URL.Scheme, req.URL.Host)
	}
	p := req.URL.Path
	c.redirect.Store(&p)
	return nil
}

// redirectedTo reports whether the last redirect the BMC answered within
// its endpoint led to the path link.
func (c *conversation) redirectedTo(link string) bool {
	p := c.redirect.Load()
	return p != nil && link != "" && strings.TrimSuffix(*p, "/") == strings.TrimSuffix(link, "/")
}
