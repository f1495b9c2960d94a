package sshdtest

import (
	"bufio"
	"encoding/binary"
	"net"
	"testing"
	"time"
)

// StartHostile runs a server on 127.0.0.1 that answers every connection
// with an SSH version line and then an SSH disconnect message carrying
// text: what anything answering on a machine's SSH address can send, before
// any host key is checked. It returns the server's address.
func StartHostile(t testing.TB, text string) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	packet := disconnectPacket(text)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				c.SetDeadline(time.Now().Add(30 * time.Second))
				c.Write([]byte("SSH-2.0-Hostile_1.0\r\n"))
				if _, err := bufio.NewReader(c).ReadString('\n'); err != nil {
					return
				}
				c.Write(packet)
				// Let the client read it before the connection closes.
				time.Sleep(100 * time.Millisecond)
			}()
		}
	}()
	return l.Addr().String()
}

// disconnectPacket is an unencrypted SSH binary packet (RFC 4253 6) with
// an SSH_MSG_DISCONNECT (RFC 4253 11.1) whose description is text.
func disconnectPacket(text string) []byte {
	var payload []byte
	payload = append(payload, 1) // SSH_MSG_DISCONNECT
	payload = binary.BigEndian.AppendUint32(payload, 2)
	payload = binary.BigEndian.AppendUint32(payload, uint32(len(text)))
	payload = append(payload, text...)
	payload = binary.BigEndian.AppendUint32(payload, 0) // language tag
	padding := 8 - (len(payload)+5)%8
	if padding < 4 {
		padding += 8
	}
	var packet []byte
	packet = binary.BigEndian.AppendUint32(packet, uint32(1+len(payload)+padding))
	packet = append(packet, byte(padding))
	packet = append(packet, payload...)
	return append(packet, make([]byte, padding)...)
}
