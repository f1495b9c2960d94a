package main

import "testing"

// Every body is sent by exactly one client, and each identity's bodies by
// one client in round order, for fleets that do and do not divide evenly.
func TestClientOrderPartitionsByIdentity(t *testing.T) {
	for _, c := range []struct{ agents, clients, rounds int }{{300, 8, 9}, {7, 3, 4}, {8, 8, 2}, {5, 1, 3}} {
		total := c.agents * c.rounds
		sentBy := make([]int, total)
		for i := range sentBy {
			sentBy[i] = -1
		}
		for cl := range c.clients {
			order := clientOrder(cl, c.clients, c.agents)
			last := map[int]int{}
			for k := 0; ; k++ {
				i := order(k)
				if i >= total {
					break
				}
				if sentBy[i] != -1 {
					t.Fatalf("%+v: body %d sent by clients %d and %d", c, i, sentBy[i], cl)
				}
				sentBy[i] = cl
				id := i % c.agents
				if prev, ok := last[id]; ok && prev >= i {
					t.Fatalf("%+v: client %d sends identity %d's body %d after %d", c, cl, id, i, prev)
				}
				last[id] = i
			}
		}
		for i, cl := range sentBy {
			if cl == -1 {
				t.Fatalf("%+v: body %d sent by no client", c, i)
			}
			if want := (i % c.agents) % c.clients; cl != want {
				t.Fatalf("%+v: body %d (identity %d) sent by client %d, want %d", c, i, i%c.agents, cl, want)
			}
		}
	}
}
