package shepherdcli

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/shepherd-fleet/shepherd/agentproto"
	"github.com/shepherd-fleet/shepherd/heartbeat"
	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
	"github.com/shepherd-fleet/shepherd/internal/replicatest"
)

// TestHostileHeartbeatPeers attacks the heartbeat endpoint of the real
// binary, served over TLS, from one source address (and from four):
//
//   - 9,000 TLS connections that complete their handshake and then send
//     nothing or one request and idle, among 1,000 plain TCP connections
//     that never start a handshake. The daemon never holds more than
//     -agent_max_conns_per_source of them (it closes the least recently
//     used idle ones, or refuses), every one is closed in the end by the
//     idle, handshake and header timeouts, /healthz keeps answering and
//     the peak RSS stays under 256 MiB. Then 3,000 TLS connections and
//     2,000 plain ones from four addresses, each under its cap: the
//     daemon holds no more than -agent_max_conns in all.
//   - A healthy agent beside a garbage sender at 100 requests/s (unknown
//     machines, which spend the address's lookup budget, forgeries,
//     malformed and stale heartbeats) and beside connections opened and
//     left idle, all from the agent's address: at least 99 % of its
//     heartbeats are accepted, and machine_agent_heartbeat advances.
func TestHostileHeartbeatPeers(t *testing.T) {
	const (
		tlsConns   = 9000
		plainConns = 1000
		perSource  = heartbeat.DefaultMaxConnsPerSource
		maxConns   = heartbeat.DefaultMaxConns
	)
	// The daemon closes its side of each connection beyond its caps, and
	// the test closes its own then: both hold about maxConns at a time.
	raiseFileLimit(t, 2*maxConns)
	dir := t.TempDir()
	certFile, keyFile, roots := writeTLSCert(t, dir)
	d, _, db, machines := unreachableFleet(t, dir, "  - id: node1\n    ssh:\n      address: 127.0.0.1\n      port: 1\n      user: root\n",
		"-processes=recovery",
		"-agent_tls_cert="+certFile, "-agent_tls_key="+keyFile,
		"-agent_idle_timeout=5s",
	)
	var addr string
	re := regexp.MustCompile(`"Serving agent heartbeats" url="https://(127\.0\.0\.1:\d+)/agent/v1/heartbeat"`)
	bmdbtest.WaitFor(t, 30*time.Second, "the heartbeat endpoint's address in the log", func() (bool, string) {
		if m := re.FindStringSubmatch(d.Log()); m != nil {
			addr = m[1]
			return true, ""
		}
		return false, "not logged"
	})
	url := "https://" + addr + heartbeat.Path
	tlsConfig := &tls.Config{RootCAs: roots, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12}
	healthy := func(when string) {
		t.Helper()
		if d.Exited() {
			t.Fatalf("%s: shepherd exited", when)
		}
		if code, body, err := d.Get("/healthz"); err != nil || code != http.StatusOK {
			t.Errorf("%s: /healthz: %d %q %v", when, code, body, err)
		}
	}

	// The idle flood, from one address, then from four (each under its
	// cap, together over the total).
	base := procStatus(t, d.PID(), "VmRSS")
	one := idleFlood(t, d, addr, tlsConfig, []string{"127.0.0.1"}, tlsConns, plainConns)
	healthy("after the flood from one address")
	if one.closedAtOnce > 0 && one.evicted+one.refused < float64(one.closedAtOnce) || one.evicted == 0 {
		t.Errorf("%g connections evicted and %g refused, with %d closed during their handshake", one.evicted, one.refused, one.closedAtOnce)
	}
	if one.maxSockets > perSource+64 {
		t.Errorf("the daemon held up to %d sockets, with -agent_max_conns_per_source %d", one.maxSockets, perSource)
	}
	var sources []string
	for i := 2; i <= 5; i++ {
		sources = append(sources, fmt.Sprintf("127.0.0.%d", i))
	}
	many := idleFlood(t, d, addr, tlsConfig, sources, 3000, maxConns-48)
	healthy("after the flood from four addresses")
	if many.evicted == 0 {
		t.Error("no connection evicted at -agent_max_conns")
	}
	if many.maxSockets > maxConns+64 {
		t.Errorf("the daemon held up to %d sockets, with -agent_max_conns %d", many.maxSockets, maxConns)
	}
	peak := procStatus(t, d.PID(), "VmHWM")
	t.Logf("RSS %d MiB before the floods, peak %d MiB: about %d KiB per connection at -agent_max_conns %d",
		base>>20, peak>>20, (peak-base)/maxConns>>10, maxConns)
	if peak > 256<<20 {
		t.Errorf("peak RSS %d MiB under the idle floods, want under 256 MiB", peak>>20)
	}

	// A healthy agent, beside garbage and idle connections from its
	// address.
	pub, key, _ := ed25519.GenerateKey(rand.Reader)
	machine := machines["node1"]
	err := db.Transact(context.Background(), func(ctx context.Context, tx *bmdb.Tx) error {
		return tx.SetAgentStarted(ctx, machine, pub)
	})
	if err != nil {
		t.Fatal(err)
	}
	// Self-check of the test's encoding: agentproto verifies it.
	if hb, err := agentproto.DecodeHeartbeat(signedHeartbeat(machine, time.Now(), key)); err != nil || hb.Verify(pub) != nil {
		t.Fatalf("the test's heartbeat does not decode and verify: %v", err)
	}
	noise, stopNoise := context.WithCancel(context.Background())
	var noisy sync.WaitGroup
	var garbage, idlers atomic.Int64
	noisy.Add(2)
	go func() { // 100 requests/s of garbage on keep-alive connections
		defer noisy.Done()
		client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: tlsConfig}}
		defer client.CloseIdleConnections()
		_, forger, _ := ed25519.GenerateKey(rand.Reader)
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for i := 0; noise.Err() == nil; i++ {
			var body []byte
			switch i % 4 {
			case 0: // an unknown machine: spends the address's lookups
				body = signedHeartbeat(uuid.New(), time.Now(), forger)
			case 1: // a forgery for the agent's machine
				body = signedHeartbeat(machine, time.Now(), forger)
			case 2: // malformed
				body = []byte(`{"version":1,"machine_id":"` + machine.String() + `","timestamp":"x"}`)
			case 3: // stale
				body = signedHeartbeat(machine, time.Now().Add(-time.Hour), key)
			}
			if resp, err := client.Post(url, "application/json", bytes.NewReader(body)); err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				garbage.Add(1)
			}
			select {
			case <-noise.Done():
			case <-tick.C:
			}
		}
	}()
	go func() { // TLS connections opened and left idle, 200 a second
		defer noisy.Done()
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				c.Close()
			}
		}()
		for noise.Err() == nil {
			if c, err := tls.DialWithDialer(&net.Dialer{Timeout: 10 * time.Second}, "tcp", addr, tlsConfig); err == nil {
				conns = append(conns, c)
				idlers.Add(1)
			}
			select {
			case <-noise.Done():
			case <-tick.C:
			}
		}
	}()
	agent := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: tlsConfig, MaxIdleConnsPerHost: 1}}
	defer agent.CloseIdleConnections()
	const beats = 200
	accepted := 0
	var lastTS, first time.Time
	var failures []string
	for range beats {
		ts := time.Now()
		if !ts.After(lastTS) {
			ts = lastTS.Add(time.Microsecond)
		}
		lastTS = ts
		resp, err := agent.Post(url, "application/json", bytes.NewReader(signedHeartbeat(machine, ts, key)))
		switch {
		case err != nil:
			failures = append(failures, err.Error())
		case resp.StatusCode == http.StatusNoContent:
			accepted++
		default:
			b, _ := io.ReadAll(resp.Body)
			failures = append(failures, fmt.Sprintf("%d %s", resp.StatusCode, b))
		}
		if resp != nil {
			resp.Body.Close()
		}
		if first.IsZero() && accepted > 0 {
			first = bmdbtest.LastHeartbeat(t, db, machine)
		}
		time.Sleep(25 * time.Millisecond)
	}
	stopNoise()
	noisy.Wait()
	t.Logf("healthy agent: %d of %d heartbeats accepted beside %d garbage requests and %d idle connections; failures: %q",
		accepted, beats, garbage.Load(), idlers.Load(), failures)
	if accepted < beats*99/100 {
		t.Errorf("%d of %d heartbeats of a healthy agent accepted, want at least 99 %%", accepted, beats)
	}
	if garbage.Load() < beats {
		t.Errorf("only %d garbage requests answered", garbage.Load())
	}
	// machine_agent_heartbeat holds when a heartbeat was received.
	if got := bmdbtest.LastHeartbeat(t, db, machine); got.Before(lastTS) || !got.After(first) {
		t.Errorf("machine_agent_heartbeat at %s, first %s, last heartbeat sent at %s: not advanced", got, first, lastTS)
	}
	if peak := procStatus(t, d.PID(), "VmHWM"); peak > 256<<20 {
		t.Errorf("peak RSS %d MiB, want under 256 MiB", peak>>20)
	}
	healthy("at the end")
	d.StopClean(30 * time.Second)
}

// floodResult is what idleFlood saw.
type floodResult struct {
	// closedAtOnce counts the connections closed before their TLS
	// handshake completed.
	closedAtOnce int
	// maxSockets is the most sockets the daemon had open.
	maxSockets int
	// evicted and refused are the daemon's counts of connections closed
	// to make room, or at once, during the flood.
	evicted, refused float64
}

// idleFlood opens tlsConns TLS connections to the heartbeat endpoint at
// addr, round robin from sources, 16 at a time: each completes its
// handshake, then two of three send one request, and then they idle. Before
// them, plainConns plain TCP connections, round robin from sources too,
// never start a handshake: cheap to open, they fill the caps at once
// however slowly the handshakes go. It waits until the daemon has closed
// every connection, and samples its sockets meanwhile.
func idleFlood(t *testing.T, d *replicatest.Run, addr string, tlsConfig *tls.Config, sources []string, tlsConns, plainConns int) floodResult {
	t.Helper()
	pid := d.PID()
	counts := func() (evicted, refused float64) {
		m, _ := d.Metrics()
		return m.Value("shepherd_heartbeat_connections_evicted_total"), m.Value("shepherd_heartbeat_connections_refused_total")
	}
	evictedBefore, refusedBefore := counts()
	var maxSockets, probes atomic.Int64
	var probeFailure atomic.Pointer[string]
	sampling, stopSampling := context.WithCancel(context.Background())
	sampled := make(chan struct{}, 2)
	go func() {
		defer func() { sampled <- struct{}{} }()
		for sampling.Err() == nil {
			if n := int64(countSockets(pid)); n > maxSockets.Load() {
				maxSockets.Store(n)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	go func() { // the probes, on -listen, keep being answered
		defer func() { sampled <- struct{}{} }()
		for sampling.Err() == nil {
			if code, body, err := d.Get("/healthz"); err != nil || code != http.StatusOK {
				failure := fmt.Sprintf("/healthz: %d %q %v", code, body, err)
				probeFailure.CompareAndSwap(nil, &failure)
			}
			probes.Add(1)
			time.Sleep(200 * time.Millisecond)
		}
	}()
	var opened, closed, closedAtOnce, handshakes, requests atomic.Int64
	var held sync.WaitGroup
	hold := func(c net.Conn, r io.Reader) {
		opened.Add(1)
		held.Add(1)
		go func() {
			defer held.Done()
			// Returns once the daemon closes the connection; it sends
			// nothing else.
			io.Copy(io.Discard, r)
			closed.Add(1)
			c.Close()
		}()
	}
	dialer := func(source string) *net.Dialer {
		return &net.Dialer{Timeout: 10 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(source)}}
	}
	for i := range plainConns {
		c, err := dialer(sources[i%len(sources)]).Dial("tcp", addr)
		if err != nil {
			t.Fatalf("plain connection: %v", err)
		}
		hold(c, c)
	}
	// Plain X25519: the cheapest handshake for both sides, as a flood
	// would choose.
	tlsConfig = tlsConfig.Clone()
	tlsConfig.CurvePreferences = []tls.CurveID{tls.X25519}
	var firstErr sync.Once
	work := make(chan int)
	var workers sync.WaitGroup
	for range 16 {
		workers.Add(1)
		go func() {
			defer workers.Done()
			for i := range work {
				raw, err := dialer(sources[i%len(sources)]).Dial("tcp", addr)
				if err != nil {
					firstErr.Do(func() { t.Logf("first failed dial: %v", err) })
					continue
				}
				c := tls.Client(raw, tlsConfig)
				c.SetDeadline(time.Now().Add(20 * time.Second))
				if err := c.Handshake(); err != nil {
					closedAtOnce.Add(1) // refused, or evicted during its handshake
					c.Close()
					continue
				}
				handshakes.Add(1)
				r := bufio.NewReader(c)
				if i%3 != 0 {
					// One request, then idle on a keep-alive connection.
					fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: shepherd\r\n\r\n", heartbeat.Path)
					resp, err := http.ReadResponse(r, nil)
					if err != nil {
						c.Close()
						continue
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					requests.Add(1)
				}
				c.SetDeadline(time.Time{})
				hold(c, r)
			}
		}()
	}
	for i := range tlsConns {
		work <- i
	}
	close(work)
	workers.Wait()
	// Every connection goes: idle ones after -agent_idle_timeout, the
	// others after the 5 s handshake and header timeouts.
	bmdbtest.WaitFor(t, 60*time.Second, "every held connection closed by the daemon", func() (bool, string) {
		n := opened.Load() - closed.Load()
		return n == 0, fmt.Sprintf("%d of %d still open", n, opened.Load())
	})
	held.Wait()
	stopSampling()
	<-sampled
	<-sampled
	if f := probeFailure.Load(); f != nil {
		t.Errorf("during the flood: %s", *f)
	}
	evicted, refused := counts()
	r := floodResult{
		closedAtOnce: int(closedAtOnce.Load()),
		maxSockets:   int(maxSockets.Load()),
		evicted:      evicted - evictedBefore,
		refused:      refused - refusedBefore,
	}
	t.Logf("flood from %d addresses: %d TLS handshakes (%d then one request), %d plain connections; %d closed during the handshake, %g evicted, %g refused; at most %d sockets open; %d /healthz probes",
		len(sources), handshakes.Load(), requests.Load(), plainConns, r.closedAtOnce, r.evicted, r.refused, r.maxSockets, probes.Load())
	return r
}

// signedHeartbeat is a version 1 heartbeat of machine at ts signed with
// key, built from the wire format of agentproto/PROTOCOL.md rather than
// with agentproto's constructors, so that it is exactly what an agent of
// that version sends.
func signedHeartbeat(machine uuid.UUID, ts time.Time, key ed25519.PrivateKey) []byte {
	var nonce [16]byte
	rand.Read(nonce[:])
	signed := append([]byte("shepherd-heartbeat-v1\x00"), 0, 0, 0, 1)
	signed = append(signed, machine[:]...)
	signed = binary.BigEndian.AppendUint64(signed, uint64(ts.UnixNano()))
	signed = append(signed, nonce[:]...)
	b, _ := json.Marshal(map[string]any{
		"version":    1,
		"machine_id": machine.String(),
		"timestamp":  ts.UTC().Format(time.RFC3339Nano),
		"nonce":      base64.StdEncoding.EncodeToString(nonce[:]),
		"signature":  base64.StdEncoding.EncodeToString(ed25519.Sign(key, signed)),
	})
	return b
}

// raiseFileLimit raises this process's limit of open files to at least
// want (up to its hard limit); the daemon it starts inherits it.
func raiseFileLimit(t *testing.T, want uint64) {
	t.Helper()
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	if lim.Cur < want {
		lim.Cur = min(want, lim.Max)
	}
	// Set even when unchanged: a child then inherits it, instead of the
	// limit the Go runtime restores for children of a process that never
	// set one.
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	if lim.Cur < want {
		t.Fatalf("open files limit %d (hard %d), want %d", lim.Cur, lim.Max, want)
	}
}

// countSockets counts the sockets pid has open (0 if it cannot tell).
func countSockets(pid int) int {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return 0
	}
	n := 0
	for _, e := range entries {
		if target, err := os.Readlink(filepath.Join(dir, e.Name())); err == nil && len(target) > 7 && target[:7] == "socket:" {
			n++
		}
	}
	return n
}

// writeTLSCert writes a self-signed ECDSA certificate for 127.0.0.1 and
// its key to dir, and returns their files and a pool that trusts it.
func writeTLSCert(t *testing.T, dir string) (certFile, keyFile string, roots *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "shepherd"},
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	roots = x509.NewCertPool()
	roots.AddCert(cert)
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "agent-cert.pem"), filepath.Join(dir, "agent-key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile, roots
}
