import Foundation
import Glibc
import Synchronization
import Testing
import TokenBrokerCore
import TokenBrokerTestSupport

@testable import TokenBrokerServer

/// `HTTPServer` on 127.0.0.1 with a small test handler, no broker: what the server hands its
/// handler, how it keeps, suspends and resumes connections, and the answers it asks the handler
/// for (a malformed head, a request while stopping, the final answer). A plain socket client
/// plays the other side, so what is checked is what goes over the wire.
///
/// Each test runs twice: on a server with threads of its own, and on one run by the HTTP client's
/// event loops (the token listener when proxies are configured).
///
/// Serialized: each test blocks its thread on a socket for a moment, and one at a time is enough.
@Suite(.serialized)
struct HTTPServerTests {
    // MARK: - Requests as values

    @Test(arguments: Polling.allCases) func requestArrivesAsAValueWithMethodPathQueryHeadersInOrderAndBody(
        _ polling: Polling
    ) throws {
        let handler = TestHandler()
        let server = try startServer(handler, polling)
        defer { server.shutDown(grace: .zero) }
        let client = try TestHTTPClient(port: server.port)

        try client.send(
            "POST /echo/a%20b?x=1&nul=a%00b&x=2&flag&long=%2Fa-value-longer-than-a-small-string HTTP/1.1\r\n"
                + "Host: test\r\nX-First: one\r\nx-second: two\r\nX-Empty:\r\n"
                + "X-First: three\r\nX-Long-Header-Name: a value longer than a small string\r\nContent-Length: 5\r\n\r\nhello"
        )
        let response = try client.readResponse()

        #expect(response.status == 200 && response.text == "ok")
        let request = try #require(handler.handled.withLock { $0.first })
        #expect(request.method == "POST")
        #expect(request.path == "/echo/a b")
        #expect(request.rawTarget == nil, "only requests under the streaming prefix carry their target as sent")
        #expect(request.query.pairs.map(\.name) == ["x", "nul", "x", "flag", "long"])
        #expect(
            request.query.pairs.map(\.value) == ["1", "a\u{0}b", "2", nil, "/a-value-longer-than-a-small-string"],
            "a decoded NUL stays in the value; a parameter without = has none")
        #expect(request.query("nul") == "a\u{0}b" && request.queryCount("x") == 2)
        #expect(
            request.headers.pairs.map(\.name) == [
                "Host", "X-First", "x-second", "X-Empty", "X-First", "X-Long-Header-Name", "Content-Length",
            ])
        #expect(
            request.headers.pairs.map(\.value) == [
                "test", "one", "two", "", "three", "a value longer than a small string", "5",
            ])
        #expect(request.header("x-long-header-name") == "a value longer than a small string")
        #expect(request.header("x-first") == "one")
        #expect(request.body == Array("hello".utf8) && !request.bodyTooLarge)
    }

    /// Query look-ups read as libmicrohttpd's own did: a name matches without regard to ASCII
    /// case, a parameter without `=` has no value, and a repeated name counts exactly, up to a NUL.
    @Test(arguments: Polling.allCases) func queryLookupsKeepLibmicrohttpdsReading(_ polling: Polling) throws {
        let handler = TestHandler()
        let server = try startServer(handler, polling)
        defer { server.shutDown(grace: .zero) }
        let client = try TestHTTPClient(port: server.port)

        try client.send("GET /q?After=5&flag&x=1&x%00=2&X=3&empty= HTTP/1.1\r\nHost: test\r\n\r\n")
        #expect(try client.readResponse().status == 200)
        let request = try #require(handler.handled.withLock { $0.first })
        #expect(request.query("after") == "5" && request.query("AFTER") == "5")
        #expect(request.query("flag") == nil, "a parameter without = reads as absent")
        #expect(request.query("empty") == "")
        #expect(request.queryCount("x") == 3, "x, x%00 and X count as the name the lookup finds")
        #expect(request.queryCount("AFTER") == 1 && request.queryCount("flag") == 1 && request.queryCount("y") == 0)
        #expect(request.query("x") == "1")
    }

    /// Bytes that are not UTF-8, in a query name and value (percent-encoded) and in a header value
    /// (obs-text), are kept as sent, and read as strings the way `String(decoding:)` repairs them.
    @Test(arguments: Polling.allCases) func fieldsKeepBytesThatAreNotUTF8(_ polling: Polling) throws {
        let handler = TestHandler()
        let server = try startServer(handler, polling)
        defer { server.shutDown(grace: .zero) }
        let client = try TestHTTPClient(port: server.port)

        try client.send(
            Array("GET /q?%FF=1&A%00b=2&v=%C3%A9%FF HTTP/1.1\r\nHost: test\r\nX-Bytes: caf".utf8)
                + [0xC3, 0xA9, 0x20, 0xFF] + Array("\r\n\r\n".utf8))
        #expect(try client.readResponse().status == 200)
        let request = try #require(handler.handled.withLock { $0.first })
        #expect(request.query.pairs.map(\.name) == ["\u{FFFD}", "A\u{0}b", "v"])
        #expect(request.query.pairs.map(\.value) == ["1", "2", "\u{E9}\u{FFFD}"])
        #expect(request.query.withName(at: 0) { Array($0) } == [0xFF])
        #expect(request.query("a") == nil && request.queryCount("a") == 1, "A%00b is a up to its NUL")
        #expect(request.header("x-bytes") == "caf\u{E9} \u{FFFD}")
        #expect(
            request.headers.withValue(at: 1) { $0.map(Array.init) } == Array("caf".utf8) + [0xC3, 0xA9, 0x20, 0xFF])
    }

    /// A body past the limit is read to its end, dropped, and refused by the server on every
    /// route; the handler never sees the request, and the connection goes on.
    @Test(arguments: Polling.allCases) func bodyPastMaximumBodyBytesIsReadThenRefusedOnEveryRoute(_ polling: Polling)
        throws
    {
        let handler = TestHandler()
        let server = try startServer(handler, polling) { $0.maximumBodyBytes = 8 }
        defer { server.shutDown(grace: .zero) }
        let client = try TestHTTPClient(port: server.port)

        try client.send("POST /fits HTTP/1.1\r\nHost: t\r\nContent-Length: 8\r\n\r\n12345678")
        #expect(try client.readResponse().status == 200)
        try client.send("POST /over HTTP/1.1\r\nHost: t\r\nContent-Length: 9\r\n\r\n123456789")
        let over = try client.readResponse()
        #expect(over.status == 413 && over.text == "too large")
        try client.send(
            "GET /over HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n9\r\n123456789\r\n0\r\n\r\n")
        #expect(try client.readResponse().status == 413)
        try client.send("GET /after HTTP/1.1\r\nHost: t\r\n\r\n")
        #expect(try client.readResponse().status == 200, "the same connection")

        let requests = handler.handled.withLock { $0 }
        #expect(requests.map(\.path) == ["/fits", "/after"])
        #expect(requests.first?.body == Array("12345678".utf8) && requests.first?.bodyTooLarge == false)
        #expect(handler.refusals.withLock { $0 } == [.bodyTooLarge, .bodyTooLarge])
    }

    @Test(arguments: Polling.allCases) func aBodyPastMaximumBodyBytesThatAwaitsContinueIsRefusedInstead(
        _ polling: Polling
    ) throws {
        let handler = TestHandler()
        let server = try startServer(handler, polling) { $0.maximumBodyBytes = 8 }
        defer { server.shutDown(grace: .zero) }
        let client = try TestHTTPClient(port: server.port)

        // Only the head: the client sends the body after `100 Continue`, which must not come.
        try client.send("POST /over HTTP/1.1\r\nHost: t\r\nContent-Length: 10000000\r\nExpect: 100-continue\r\n\r\n")
        let response = try client.readResponse()

        #expect(response.status == 413 && response.text == "too large")
        #expect(handler.refusals.withLock { $0 } == [.bodyTooLarge])
        #expect(handler.handled.withLock { $0.isEmpty }, "the handler never sees the request")
        #expect(client.isClosedByServer(), "the unread body leaves nothing to read the next request from")

        // HTTP/1.0 gets no `100 Continue`, so its client sends the body at once: read, then refused.
        let old = try TestHTTPClient(port: server.port)
        try old.send("POST /old HTTP/1.0\r\nContent-Length: 9\r\nExpect: 100-continue\r\n\r\n123456789")
        #expect(try old.readResponse().status == 413)
        #expect(handler.refusals.withLock { $0 } == [.bodyTooLarge, .bodyTooLarge])
        #expect(handler.handled.withLock { $0.isEmpty })
    }

    @Test(arguments: Polling.allCases) func keepAliveServesTwoRequestsOnOneConnection(_ polling: Polling) throws {
        let handler = TestHandler { request in .response(TestHandler.text(200, "answer to \(request.path)")) }
        let server = try startServer(handler, polling)
        defer { server.shutDown(grace: .zero) }
        let client = try TestHTTPClient(port: server.port)

        try client.send("GET /one HTTP/1.1\r\nHost: t\r\n\r\n")
        let first = try client.readResponse()
        try client.send("GET /two HTTP/1.1\r\nHost: t\r\n\r\n")
        let second = try client.readResponse()

        #expect(first.status == 200 && first.text == "answer to /one")
        #expect(second.status == 200 && second.text == "answer to /two")
        #expect(handler.handled.withLock { $0.map(\.path) } == ["/one", "/two"])
        #expect(server.openConnections == 1)
    }

    /// RFC 9110 §8.6: a 304 may carry `Content-Length` only with the length of the body it
    /// stands for. libmicrohttpd says that length and sends no body, and the connection goes on:
    /// the next answer on it starts right after the head.
    @Test(arguments: Polling.allCases) func aNotModifiedAnswerStandingForABodySaysItsLengthAndSendsNone(
        _ polling: Polling
    ) throws {
        let handler = TestHandler { request in
            request.path == "/same"
                ? .response(HTTPResponse(status: 304, headers: [("ETag", "\"7\"")], standingFor: 1234))
                : .response(TestHandler.text(200, "next"))
        }
        let server = try startServer(handler, polling)
        defer { server.shutDown(grace: .zero) }
        let client = try TestHTTPClient(port: server.port)

        try client.send("GET /same HTTP/1.1\r\nHost: t\r\n\r\n")
        let notModified = try client.readHead()
        try client.send("GET /next HTTP/1.1\r\nHost: t\r\n\r\n")
        let next = try client.readResponse()

        #expect(notModified.status == 304 && notModified.header("Content-Length") == "1234")
        #expect(notModified.header("Transfer-Encoding") == nil && notModified.header("ETag") == "\"7\"")
        #expect(next.status == 200 && next.text == "next", "no byte of a body came between the two")
    }

    /// Servers on the event loops share their threads: each loop polls one daemon of each. Every
    /// server answers with its own routes, and stopping one leaves the others serving.
    @Test func serversSharingTheEventLoopsAnswerEachWithItsOwnRoutesAndStopAlone() throws {
        let servers = try (0..<3).map { index in
            try startServer(TestHandler { _ in .response(TestHandler.text(200, "server \(index)")) }, .eventLoops)
        }
        defer { for server in servers { server.shutDown(grace: .zero) } }
        func ask(_ server: HTTPServer) throws -> String {
            let client = try TestHTTPClient(port: server.port)
            try client.send("GET /who HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
            return try client.readResponse().text
        }
        // Several connections each, so that more than one of each server's daemons accepts.
        for _ in 0..<8 {
            #expect(try servers.map(ask) == ["server 0", "server 1", "server 2"])
        }

        servers[1].shutDown(grace: .zero)

        #expect(TestHTTPClient.isRefused(port: servers[1].port))
        for _ in 0..<8 {
            #expect(try ask(servers[0]) == "server 0")
            #expect(try ask(servers[2]) == "server 2")
        }
    }

    // MARK: - Deferred answers

    @Test(arguments: Polling.allCases) func deferredAnswerResumesTheConnectionAndIsSent(_ polling: Polling) async throws
    {
        let handler = TestHandler.deferring()
        let server = try startServer(handler, polling)
        defer { server.shutDown(grace: .zero) }
        let client = try TestHTTPClient(port: server.port)

        try client.send("GET /wait HTTP/1.1\r\nHost: t\r\n\r\n")
        #expect(await eventually { handler.deferred.count == 1 })
        #expect(server.inFlight == 1)
        handler.deferred[0].respond(TestHandler.text(200, "later"))
        let response = try client.readResponse()
        #expect(response.status == 200 && response.text == "later")

        // The resumed connection is kept alive, and can wait again.
        try client.send("GET /again HTTP/1.1\r\nHost: t\r\n\r\n")
        #expect(await eventually { handler.deferred.count == 2 })
        handler.deferred[1].respond(TestHandler.text(201, "again"))
        let second = try client.readResponse()
        #expect(second.status == 201 && second.text == "again")
        #expect(await eventually { server.inFlight == 0 })
    }

    /// A deferring server with one request waiting on it, and the count of that wait's cleanups.
    /// A new connection that asked `GET /now` and read its answer, kept open (kept alive).
    private func keptAlive(_ server: HTTPServer) throws -> TestHTTPClient {
        let client = try TestHTTPClient(port: server.port)
        try client.send("GET /now HTTP/1.1\r\nHost: t\r\n\r\n")
        #expect(try client.readResponse().text == "ok")
        return client
    }

    private func oneWaiting(_ polling: Polling) async throws -> (TestHandler, HTTPServer, TestHTTPClient, Lock<Int>) {
        let handler = TestHandler.deferring()
        let server = try startServer(handler, polling)
        let client = try TestHTTPClient(port: server.port)
        try client.send("GET /wait HTTP/1.1\r\nHost: t\r\n\r\n")
        #expect(await eventually { handler.deferred.count == 1 })
        let closed = Lock<Int>(0)
        handler.deferred[0].onClose { closed.withLock { $0 += 1 } }
        return (handler, server, client, closed)
    }

    @Test(arguments: Polling.allCases) func clientHangingUpWhileDeferredRunsOnClose(_ polling: Polling) async throws {
        let (handler, server, client, closed) = try await oneWaiting(polling)
        defer { server.shutDown(grace: .zero) }

        client.close()

        #expect(await eventually { closed.withLock { $0 } == 1 })
        #expect(await eventually { server.inFlight == 0 && server.openConnections == 0 })
        // An answer after the hang-up does nothing, and the cleanup does not run again.
        handler.deferred[0].respond(TestHandler.text(200, "too late"))
        #expect(closed.withLock { $0 } == 1)
    }

    /// The hang-up watch can see a client go between the connection's suspension and the
    /// handler's `onClose` (a long-poll registers its waiter, then its cleanup): a cleanup
    /// registered after the hang-up must run at once, or the waiter stays until its deadline.
    @Test(arguments: Polling.allCases) func aCleanupRegisteredAfterTheHangUpRunsAtOnce(_ polling: Polling) async throws
    {
        let handler = TestHandler.deferring()
        let server = try startServer(handler, polling)
        defer { server.shutDown(grace: .zero) }
        let client = try TestHTTPClient(port: server.port)
        try client.send("GET /wait HTTP/1.1\r\nHost: t\r\n\r\n")
        #expect(await eventually { handler.deferred.count == 1 })
        let responder = try #require(handler.deferred[0] as? HTTPResponder)
        // What the watcher does on seeing the hang-up, before the handler got to `onClose`.
        responder.clientHungUp()
        let closed = Lock<Int>(0)
        responder.onClose { closed.withLock { $0 += 1 } }
        #expect(closed.withLock { $0 } == 1)
        client.close()
        #expect(await eventually { server.inFlight == 0 && server.openConnections == 0 })
        #expect(closed.withLock { $0 } == 1, "run once")
    }

    /// The socket's hang-up watch outlives an answered wait (nothing is undone on the answer's
    /// path), and the next wait on the same kept-alive connection takes it over without a new
    /// registration: its hang-up must reach the second request, not the first, answered one.
    @Test(arguments: Polling.allCases) func aHangUpDuringASecondWaitOnAKeptAliveConnectionRunsItsOnClose(
        _ polling: Polling
    ) async throws {
        let (handler, server, client, firstClosed) = try await oneWaiting(polling)
        defer { server.shutDown(grace: .zero) }
        handler.deferred[0].respond(TestHandler.text(200, "first"))
        #expect(try client.readResponse().text == "first")

        try client.send("GET /wait HTTP/1.1\r\nHost: t\r\n\r\n")
        #expect(await eventually { handler.deferred.count == 2 })
        let secondClosed = Lock<Int>(0)
        handler.deferred[1].onClose { secondClosed.withLock { $0 += 1 } }
        client.close()

        #expect(await eventually { secondClosed.withLock { $0 } == 1 })
        #expect(await eventually { server.inFlight == 0 && server.openConnections == 0 })
        #expect(firstClosed.withLock { $0 } == 0, "the first wait was answered")
    }

    /// A client that only half-closes while its request waits still reads an answer: the
    /// handler's `refusal(.clientClosed)`, and the wait's cleanup runs.
    @Test(arguments: Polling.allCases) func aHalfClosedClientWhileDeferredReadsTheHandlersClientClosedAnswer(
        _ polling: Polling
    ) async throws {
        let (_, server, client, closed) = try await oneWaiting(polling)
        defer { server.shutDown(grace: .zero) }

        client.closeSending()
        let response = try client.readResponse()

        #expect(response.status == 503 && response.text == "client closed")
        #expect(closed.withLock { $0 } == 1)
    }

    /// The same beside other kept-alive connections that finished a request, every time, for
    /// GET and HEAD. libmicrohttpd 0.9.75 takes a resumed connection as ready to read, and reads
    /// the half-close's end (and closes the connection) before it asks for the answer, unless the
    /// connection is the one of its daemon idle longest (then the answer comes first): with
    /// another connection there, the answer was lost, and now goes straight to the socket.
    @Test(arguments: Polling.allCases) func aHalfClosedClientBesideKeptAliveConnectionsReadsTheAnswerEveryTime(
        _ polling: Polling
    ) async throws {
        let handler = TestHandler.deferring("/wait")
        // One daemon on its own threads, so that every wait shares it with the kept connections.
        let server = try startServer(handler, polling) { $0.threads = 1 }
        defer { server.shutDown(grace: .zero) }
        let kept = try (0..<4).map { _ in try keptAlive(server) }

        var unanswered: [String] = []
        for round in 1...20 {
            let method = round % 2 == 0 ? "HEAD" : "GET"
            let client = try TestHTTPClient(port: server.port)
            try client.send("\(method) /wait HTTP/1.1\r\nHost: t\r\n\r\n")
            #expect(await eventually { handler.deferred.count == round })
            client.closeSending()
            do {
                let response = try method == "HEAD" ? client.readHead() : client.readResponse()
                #expect(response.status == 503 && response.header("Content-Length") == "13")
                if method == "GET" { #expect(response.text == "client closed") }
                if method == "HEAD" { #expect(client.isClosedByServer(), "no body follows the head") }
            } catch {
                unanswered.append("round \(round) (\(method)): \(error)")
            }
        }
        #expect(unanswered.isEmpty, "\(unanswered.count) of 20 half-closed clients read no answer: \(unanswered)")
        #expect(await eventually { server.inFlight == 0 && server.waitingRequests == 0 })
        for client in kept {
            try client.send("GET /now HTTP/1.1\r\nHost: t\r\n\r\n")
            #expect(try client.readResponse().text == "ok", "the kept connections stay served")
        }
    }

    /// A request under the streaming prefix (a proxied one) whose body is whole and whose answer
    /// is not ready waits as a deferred one does: a half-close there reads the handler's
    /// `refusal(.clientClosed)` and the wait's cleanup runs, beside a kept-alive connection too.
    /// It was not watched: the client read nothing until the answer came.
    @Test(arguments: Polling.allCases) func aHalfClosedClientWhoseStreamedRequestWaitsReadsTheClientClosedAnswer(
        _ polling: Polling
    ) async throws {
        let responders = Lock<[any HTTPResponding]>([])
        let closed = Lock<Int>(0)
        let handler = TestHandler(
            responders: responders,
            answer: { _ in
                .deferred { responder in
                    responder.onClose { closed.withLock { $0 += 1 } }
                    responders.withLock { $0.append(responder) }
                }
            }, begin: { _ in .stream(HTTPRequestBodyStream(limit: 1 << 20)) })
        let server = try startServer(handler, polling) {
            $0.streamingPrefix = "/up/"
            $0.threads = 1
        }
        defer { server.shutDown(grace: .zero) }
        let kept = try TestHTTPClient(port: server.port)
        try kept.send("POST /up/now HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\n\r\n")
        #expect(await eventually { handler.deferred.count == 1 })
        handler.deferred[0].respond(TestHandler.text(200, "ok"))
        #expect(try kept.readResponse().text == "ok")

        for round in 2...5 {
            let client = try TestHTTPClient(port: server.port)
            try client.send("POST /up/wait HTTP/1.1\r\nHost: t\r\nContent-Length: 4\r\n\r\nbody")
            #expect(await eventually { handler.deferred.count == round && server.waitingRequests == 1 })
            // The body read to its end, and the connection suspended for the answer.
            #expect(await eventually { server.inFlight == 1 })
            client.closeSending()
            let response = try client.readResponse()
            #expect(response.status == 503 && response.text == "client closed", "round \(round)")
            #expect(await eventually { closed.withLock { $0 } == round - 1 && server.inFlight == 0 })
        }
        try kept.send("POST /up/now HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\n\r\n")
        #expect(await eventually { handler.deferred.count == 6 })
        handler.deferred[5].respond(TestHandler.text(200, "still ok"))
        #expect(try kept.readResponse().text == "still ok", "the kept connection stays served")
    }

    // MARK: - Waiting places

    /// Seven eighths of the connection limit may wait (14 of 16); the next request that would
    /// wait gets the handler's `refusal(.tooManyWaiting)` at once, its deferred work never starts,
    /// and requests answered at once still get in, on its connection and on a new one.
    @Test(arguments: Polling.allCases) func waitsPastSevenEighthsOfTheConnectionLimitAreRefusedAndOthersStillGetIn(
        _ polling: Polling
    ) async throws {
        let handler = TestHandler.deferring("/wait")
        let server = try startServer(handler, polling) { $0.connectionLimit = 16 }
        defer { server.shutDown(grace: .zero) }
        #expect(server.waitingLimit == 14)
        // One at a time, so that `handler.deferred[i]` is `waiting[i]`'s.
        var waiting: [TestHTTPClient] = []
        for count in 1...14 {
            let client = try TestHTTPClient(port: server.port)
            try client.send("GET /wait HTTP/1.1\r\nHost: t\r\n\r\n")
            waiting.append(client)
            #expect(await eventually { handler.deferred.count == count })
        }
        #expect(server.waitingRequests == 14)

        let refused = try TestHTTPClient(port: server.port)
        try refused.send("GET /wait HTTP/1.1\r\nHost: t\r\n\r\n")
        let answer = try refused.readResponse()

        #expect(answer.status == 503 && answer.text == "too many waiting: 14 at /wait")
        #expect(handler.deferred.count == 14, "the refused request's deferred work never started")
        #expect(server.refusedWaits == 1 && server.waitingRequests == 14)
        try refused.send("GET /now HTTP/1.1\r\nHost: t\r\n\r\n")
        #expect(try refused.readResponse().text == "ok", "the refused request's connection is kept")
        let other = try keptAlive(server)

        // A place given back is taken again.
        handler.deferred[0].respond(TestHandler.text(200, "first"))
        #expect(try waiting[0].readResponse().text == "first")
        #expect(server.waitingRequests == 13)
        try waiting[0].send("GET /wait HTTP/1.1\r\nHost: t\r\n\r\n")
        #expect(await eventually { handler.deferred.count == 15 })
        #expect(server.waitingRequests == 14 && server.refusedWaits == 1)
        _ = (waiting, other)
    }

    /// A streamed upload whose handler would wait, on a full listener, is refused at once, before
    /// its body, and the request's stream is let go; the waits already there go on.
    @Test(arguments: Polling.allCases) func aStreamedUploadPastTheCapIsRefusedBeforeItsBody(_ polling: Polling)
        async throws
    {
        let responders = Lock<[any HTTPResponding]>([])
        let handler = TestHandler(
            responders: responders,
            answer: { _ in .deferred { responder in responders.withLock { $0.append(responder) } } },
            begin: { _ in .stream(HTTPRequestBodyStream(limit: 1 << 20)) })
        let server = try startServer(handler, polling) {
            $0.connectionLimit = 16
            $0.streamingPrefix = "/up/"
        }
        defer { server.shutDown(grace: .zero) }
        // One at a time, so that `handler.deferred[i]` is `waiting[i]`'s.
        var waiting: [TestHTTPClient] = []
        for count in 1...14 {
            let client = try TestHTTPClient(port: server.port)
            try client.send("GET /wait HTTP/1.1\r\nHost: t\r\n\r\n")
            waiting.append(client)
            #expect(await eventually { handler.deferred.count == count })
        }

        // The head promises a body that never comes: only an answer given before it can arrive.
        let uploading = try TestHTTPClient(port: server.port)
        try uploading.send("POST /up/load HTTP/1.1\r\nHost: t\r\nContent-Length: 200000\r\n\r\n")
        let answer = try uploading.readResponse()

        #expect(answer.status == 503 && answer.text == "too many waiting: 14 at /up/load")
        #expect(handler.deferred.count == 14 && server.waitingRequests == 14)
        handler.deferred[0].respond(TestHandler.text(200, "still served"))
        #expect(try waiting[0].readResponse().text == "still served")
    }

    /// The place a wait holds comes back once, whichever way the wait ends: answered from the
    /// handler's `start` itself, answered later, the client hanging up (a half-close takes the
    /// same path, `clientHungUp`), going away mid-body, or the server stopping; a second answer
    /// gives nothing back. `whenWaitEnds` runs
    /// once for each wait, before the answer goes out.
    @Test(arguments: Polling.allCases) func everyWayAWaitEndsGivesItsPlaceBackOnce(_ polling: Polling) async throws {
        let responders = Lock<[any HTTPResponding]>([])
        let ended = Lock<Int>(0)
        let handler = TestHandler(
            responders: responders,
            answer: { request in
                .deferred { responder in
                    responder.whenWaitEnds { ended.withLock { $0 += 1 } }
                    if request.path == "/at-once" {
                        responder.respond(TestHandler.text(200, "at once"))
                    } else {
                        responders.withLock { $0.append(responder) }
                    }
                }
            }, begin: { _ in .stream(HTTPRequestBodyStream(limit: 1024)) })
        let server = try startServer(handler, polling) {
            $0.connectionLimit = 16
            $0.streamingPrefix = "/up/"
        }
        defer { server.shutDown(grace: .zero) }
        let client = try TestHTTPClient(port: server.port)

        // Answered from `start`: more times than there are places, on one kept-alive connection.
        for round in 1...20 {
            try client.send("GET /at-once HTTP/1.1\r\nHost: t\r\n\r\n")
            #expect(try client.readResponse().text == "at once", "round \(round)")
            #expect(server.waitingRequests == 0 && ended.withLock { $0 } == round)
        }
        // Answered later: the place is back before the answer can be read.
        try client.send("GET /wait HTTP/1.1\r\nHost: t\r\n\r\n")
        #expect(await eventually { handler.deferred.count == 1 })
        #expect(server.waitingRequests == 1)
        handler.deferred[0].respond(TestHandler.text(200, "later"))
        #expect(try client.readResponse().text == "later")
        #expect(server.waitingRequests == 0 && ended.withLock { $0 } == 21)
        handler.deferred[0].respond(TestHandler.text(200, "again"))
        #expect(server.waitingRequests == 0 && ended.withLock { $0 } == 21, "a second answer gives nothing back")

        // The client hangs up.
        let leaving = try TestHTTPClient(port: server.port)
        try leaving.send("GET /wait HTTP/1.1\r\nHost: t\r\n\r\n")
        #expect(await eventually { handler.deferred.count == 2 })
        #expect(server.waitingRequests == 1)
        leaving.close()
        #expect(await eventually { server.waitingRequests == 0 })
        handler.deferred[1].respond(TestHandler.text(200, "too late"))
        #expect(server.waitingRequests == 0 && ended.withLock { $0 } == 22)

        // The client goes away in the middle of a streamed body: the request ends unanswered.
        let uploading = try TestHTTPClient(port: server.port)
        try uploading.send("POST /up/load HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\n12345")
        #expect(await eventually { handler.deferred.count == 3 })
        #expect(server.waitingRequests == 1)
        uploading.close()
        #expect(await eventually { server.waitingRequests == 0 })
        #expect(ended.withLock { $0 } == 23)

        // The server stops: the waits it answers give their places back.
        let last = try TestHTTPClient(port: server.port)
        try last.send("GET /wait HTTP/1.1\r\nHost: t\r\n\r\n")
        #expect(await eventually { handler.deferred.count == 4 })
        let shutdown = BackgroundWork { server.shutDown(grace: .milliseconds(500)) }
        #expect(try last.readResponse().text == "stopped")
        #expect(await eventually(within: 30) { shutdown.isDone })
        #expect(server.waitingRequests == 0 && ended.withLock { $0 } == 24)
    }

    // MARK: - Shutting down

    @Test(arguments: Polling.allCases) func shutDownAnswersADeferredRequestWithTheHandlersStoppedAnswer(
        _ polling: Polling
    ) async throws {
        let handler = TestHandler.deferring()
        let server = try startServer(handler, polling)
        let client = try TestHTTPClient(port: server.port)
        try client.send("GET /wait HTTP/1.1\r\nHost: t\r\n\r\n")
        #expect(await eventually { handler.deferred.count == 1 })

        let shutdown = BackgroundWork { server.shutDown(grace: .milliseconds(500)) }
        let response = try client.readResponse()

        #expect(response.status == 503 && response.text == "stopped")
        #expect(handler.refusals.withLock { $0 } == [.stopped])
        #expect(await eventually(within: 30) { shutdown.isDone })
    }

    /// A daemon at its connection limit takes the listening socket out of its epoll set, and
    /// puts it back when a connection closes. With libmicrohttpd's own polling threads, a stop
    /// beside that churn aborted the process ("Failed to remove listen FD from epoll set",
    /// daemon.c:5531 or 4940) in two runs of five of 100 stops; now each daemon is quiesced on
    /// the thread that polls it. A failure here is the test process ending on SIGABRT.
    @Test(arguments: Polling.allCases) func stoppingNearTheConnectionLimitUnderChurnNeverAborts(_ polling: Polling)
        async throws
    {
        let served = Atomic<Int>(0)
        let work = BackgroundWork {
            let start = ContinuousClock.now
            for round in 0..<300 where ContinuousClock.now - start < .seconds(20) {
                let handler = TestHandler()
                guard
                    let server = try? startServer(
                        handler, polling,
                        configure: {
                            $0.threads = 4
                            $0.connectionLimit = 8
                        })
                else { return }
                let stop = Atomic<Bool>(false)
                let clients = DispatchGroup()
                // Twice as many clients as places, each opening a connection per request.
                for _ in 0..<16 {
                    clients.enter()
                    Thread.detachNewThread {
                        defer { clients.leave() }
                        for _ in 0..<1000 where !stop.load(ordering: .acquiring) {
                            guard let client = try? TestHTTPClient(port: server.port, timeoutSeconds: 2),
                                (try? client.send("GET / HTTP/1.1\r\nHost: t\r\n\r\n")) != nil,
                                (try? client.readResponse()) != nil
                            else { continue }
                        }
                    }
                }
                usleep(useconds_t(5_000 + round % 7 * 3_000))
                server.shutDown(grace: .zero)
                stop.store(true, ordering: .releasing)
                clients.wait()
                served.add(handler.handled.withLock { $0.count }, ordering: .relaxed)
            }
        }
        #expect(await eventually(within: 120) { work.isDone })
        #expect(served.load(ordering: .relaxed) > 300, "the clients were answered while the servers ran")
    }

    /// An upload whose body ends after the stop resumed the suspended connections for the last
    /// time was suspended all the same, to wait for its answer, and `MHD_stop_daemon` then
    /// aborted the process ("called while we have suspended connections"). The consumer's
    /// wake-up runs on the daemon's thread as the body arrives, and holds that thread here until
    /// the stop is well past that point. A failure is the test process ending on SIGABRT.
    @Test(arguments: Polling.allCases) func anUploadEndingAfterTheLastResumeIsClosedAndTheStopDoesNotAbort(
        _ polling: Polling
    ) async throws {
        let waiting = Atomic<Int>(0)
        let release = DispatchSemaphore(value: 0)
        let handler = TestHandler(
            answer: { request in
                guard let body = request.bodyStream else { return .response(TestHandler.text(500, "no stream")) }
                // Never answered: the body's end finds the request still waiting.
                return .deferred { _ in
                    body.whenAvailable { _ = release.wait(timeout: .now() + 10) }
                    var byte = [UInt8](repeating: 0, count: 1)
                    if case .wait = byte.withUnsafeMutableBytes({ body.read(into: $0) }) {
                        waiting.add(1, ordering: .relaxed)
                    }
                }
            }, begin: { _ in .stream(HTTPRequestBodyStream(limit: 1024)) })
        let server = try startServer(handler, polling) { $0.streamingPrefix = "/up/" }
        let client = try TestHTTPClient(port: server.port)
        try client.send("POST /up/load HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\r\n")
        #expect(await eventually { waiting.load(ordering: .relaxed) == 1 })

        // The last resume comes half a second in; the wake-up holds the thread for two.
        let shutdown = BackgroundWork { server.shutDown(grace: .milliseconds(500)) }
        #expect(await eventually { TestHTTPClient.isRefused(port: server.port) }, "the daemons' threads are free again")
        try client.send("12345")
        try await Task.sleep(for: .seconds(2))
        release.signal()

        #expect(await eventually(within: 30) { shutdown.isDone })
        #expect(client.isClosedByServer())
    }

    @Test(arguments: Polling.allCases) func requestDuringTheDrainGetsTheHandlersStoppingAnswerWhileAnswersInFlightGoOn(
        _ polling: Polling
    ) async throws {
        let handler = TestHandler.deferring("/wait")
        let server = try startServer(handler, polling)
        let waiting = try TestHTTPClient(port: server.port)
        try waiting.send("GET /wait HTTP/1.1\r\nHost: t\r\n\r\n")
        #expect(await eventually { handler.deferred.count == 1 })
        let kept = try keptAlive(server)

        // The grace is long: the drain lasts until the waiting request is answered below.
        let shutdown = BackgroundWork { server.shutDown(grace: .seconds(60)) }
        #expect(await eventually { TestHTTPClient.isRefused(port: server.port) }, "new connections are refused")
        try kept.send("GET /late HTTP/1.1\r\nHost: t\r\n\r\n")
        let late = try kept.readResponse()

        #expect(late.status == 503 && late.text == "stopping")
        #expect(kept.isClosedByServer())
        // The final answer (`.stopped`) is asked for when shutting down begins; `.stopping` once, for `/late`.
        #expect(handler.refusals.withLock { $0.filter { $0 == .stopping }.count } == 1)
        #expect(!handler.handled.withLock { $0.map(\.path) }.contains("/late"))

        handler.deferred[0].respond(TestHandler.text(200, "done"))
        let answer = try waiting.readResponse()
        #expect(answer.status == 200 && answer.text == "done")
        #expect(await eventually(within: 30) { shutdown.isDone })
    }

    // MARK: - What the server refuses itself

    @Test(arguments: Polling.allCases) func malformedHeadGetsTheHandlersAnswerAndTheConnectionCloses(_ polling: Polling)
        throws
    {
        let handler = TestHandler()
        let server = try startServer(handler, polling)
        defer { server.shutDown(grace: .zero) }
        let client = try TestHTTPClient(port: server.port)

        try client.send(
            "POST /x HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
        let response = try client.readResponse()

        #expect(response.status == 400)
        let refusals = handler.refusals.withLock { $0 }
        try #require(refusals.count == 1)
        guard case .malformedHead(let problem) = refusals[0] else {
            Issue.record("refused as \(refusals[0]), not as a malformed head")
            return
        }
        #expect(!problem.isEmpty && response.text == "malformed: \(problem)")
        #expect(handler.handled.withLock { $0.isEmpty }, "no route sees a malformed request")
        #expect(client.isClosedByServer())
    }

    /// libmicrohttpd reads a query's arguments from the `?` it finds over the whole target, a NUL
    /// sent raw before it or not; the server counted them only up to that NUL. 200 of them did
    /// not fit its 4 KiB, and it then lost its own 431: no answer until the connection's timeout.
    /// Now the query is ended where it starts, and the NUL refused with the head (400). A NUL
    /// followed by `HTTP/1.1` and a NUL looks like the target's end, and the arguments past it
    /// are met as libmicrohttpd decodes them: the 400 then goes straight to the socket; so too
    /// behind a path that fills the connection's memory, where not one argument fits.
    @Test(arguments: Polling.allCases) func aTargetWithARawNULBeforeItsQueryIsRefusedAtOnceHoweverLongItsQuery(
        _ polling: Polling
    ) throws {
        let handler = TestHandler()
        let server = try startServer(handler, polling)
        defer { server.shutDown(grace: .zero) }
        let arguments = Array((0..<200).map { "a\($0)=1" }.joined(separator: "&").utf8)
        let targets: [[UInt8]] = [
            Array("/tok\0en?".utf8) + arguments,
            Array("/t\0o\0\0ken?".utf8) + arguments,
            Array("/a\0HTTP/1.1\0?".utf8) + arguments,
            Array("/a\0HTTP/1.1\0\0?".utf8) + arguments,
            Array("/a\0HTTP/1.1\0".utf8) + [UInt8](repeating: UInt8(ascii: "p"), count: 4000) + Array("?x=1".utf8),
            Array("/a\0HTTP/1.1\0".utf8) + [UInt8](repeating: UInt8(ascii: "p"), count: 3950) + Array("?x=1".utf8),
        ]
        for target in targets {
            let client = try TestHTTPClient(port: server.port)
            try client.send(Array("GET ".utf8) + target + Array(" HTTP/1.1\r\nHost: t\r\n\r\n".utf8))
            let response = try client.readResponse()
            #expect(response.status == 400 && response.text == "malformed: \(RequestTarget.nulProblem)")
            #expect(client.isClosedByServer(), "the connection closes after the refusal")
        }
        #expect(handler.handled.withLock { $0.isEmpty }, "no route sees a target with a NUL")
        // The server still answers.
        let client = try TestHTTPClient(port: server.port)
        try client.send("GET /after HTTP/1.1\r\nHost: t\r\n\r\n")
        #expect(try client.readResponse().status == 200)
    }

    /// libmicrohttpd builds the answer's head in the connection's memory, beside the request's
    /// head, and closed the connection without a byte when it did not fit (4 KiB: heads from
    /// 3,750 to 3,900 bytes; from 3,920 it gave its own 431). Every head now gets its answer or
    /// 431: the server's, through libmicrohttpd or, where even that does not fit, straight to the
    /// socket; or libmicrohttpd's own, for a head it cannot hold.
    @Test(arguments: Polling.allCases, [4096, 16384]) func everyHeadGetsItsAnswerOr431NeverASilentClose(
        _ polling: Polling, _ memory: Int
    ) throws {
        let handler = TestHandler()
        let server = try startServer(handler, polling) { $0.connectionMemoryLimit = memory }
        defer { server.shutDown(grace: .zero) }
        let cookies = "Cookie: " + Array(repeating: "a=1", count: 10).joined(separator: "; ")
        let shapes: [(name: String, method: String, lines: [String], query: Int)] = [
            ("one long header", "GET", ["X-Pad: "], 0),
            ("twenty headers", "GET", (0..<19).map { "X-\($0): v" } + ["X-Pad: "], 0),
            ("query arguments", "GET", ["X-Pad: "], 30),
            ("cookies", "GET", [cookies, "X-Pad: "], 0),
            ("HEAD", "HEAD", ["X-Pad: "], 0),
        ]
        // Every size near the limit, where the room left runs out; a few well within it.
        let sizes =
            [memory - 3000, memory - 2000, memory - 1200, memory - 1000]
            + Array(stride(from: memory - 700, through: memory + 64, by: 4))
        for shape in shapes {
            var answered: [Int: Int] = [:]
            for size in sizes {
                let head = Self.head(size, lines: shape.lines, query: shape.query, method: shape.method)
                // libmicrohttpd copies the first `Cookie` header and adds a record per cookie before
                // the server sees the head; when that does not fit, it sends its 431 twice, or
                // not at all, and nothing the server does can change it (README).
                let records = 1 + shape.lines.count + shape.query
                if shape.name == "cookies", memory - (size + 15) / 16 * 16 - records * 64 < 10 * 64 + 64 { continue }
                let client = try TestHTTPClient(port: server.port)
                try client.send(head)
                guard let response = try? (shape.method == "HEAD" ? client.readHead() : client.readResponse()) else {
                    Issue.record("\(shape.name), a head of \(size) bytes in \(memory): closed without an answer")
                    continue
                }
                answered[response.status, default: 0] += 1
                #expect([200, 431].contains(response.status), "\(shape.name), \(size) bytes: \(response.status)")
                if response.status == 431 {
                    #expect(
                        shape.method == "HEAD" || response.text == "head too large"
                            || response.text.contains("Request too big"),
                        "\(shape.name), \(size) bytes: \(response.text)")
                    #expect(response.header("Connection") == "close" && client.isClosedByServer())
                }
            }
            // Heads well within the memory are answered; the largest are not.
            #expect(answered[200, default: 0] > 0 && answered[431, default: 0] > 0, "\(shape.name): \(answered)")
        }
        #expect(handler.refusals.withLock { $0.allSatisfy { $0 == .headTooLarge } })
    }

    /// A request head of `size` bytes: `method`, a target with `query` arguments, `Host`, then
    /// `lines` as headers, the last padded to reach `size`.
    static func head(_ size: Int, lines: [String], query: Int = 0, method: String = "GET") -> [UInt8] {
        let target = query == 0 ? "/x" : "/x?" + (0..<query).map { "q\($0)" }.joined(separator: "&")
        let start = "\(method) \(target) HTTP/1.1\r\nHost: t\r\n" + lines.map { $0 + "\r\n" }.joined().dropLast(2)
        let padding = String(repeating: "a", count: max(0, size - start.utf8.count - 4))
        return Array((start + padding + "\r\n\r\n").utf8)
    }

    // MARK: - The streaming prefix

    @Test(arguments: Polling.allCases) func beginSeesTheHeadBeforeTheBodyAndRefuseAnswersWithoutReadingIt(
        _ polling: Polling
    ) throws {
        let handler = TestHandler(begin: { request in
            request.path == "/up/refuse"
                ? .refuse(TestHandler.text(413, "refused", headers: [("Connection", "close")])) : .buffer(limit: 4)
        })
        let server = try startServer(handler, polling) { $0.streamingPrefix = "/up/" }
        defer { server.shutDown(grace: .zero) }
        let client = try TestHTTPClient(port: server.port)

        // The head promises a body that never comes: only an answer given before it can arrive.
        try client.send("PUT /up/refuse?q=%41 HTTP/1.1\r\nHost: t\r\nContent-Length: 100000\r\n\r\n")
        let response = try client.readResponse()

        #expect(response.status == 413 && response.text == "refused")
        let seen = handler.begun.withLock { $0 }
        try #require(seen.count == 1)
        #expect(seen[0].method == "PUT" && seen[0].path == "/up/refuse")
        #expect(seen[0].rawTarget == "/up/refuse?q=%41" && seen[0].query("q") == "A")
        #expect(seen[0].headers.pairs.map(\.name) == ["Host", "Content-Length"])
        #expect(handler.handled.withLock { $0.isEmpty }, "a refused request is not handled")
        #expect(client.isClosedByServer())
    }

    @Test(arguments: Polling.allCases) func bufferLimitFromBeginAppliesUnderThePrefixAndOtherPathsSkipBegin(
        _ polling: Polling
    ) throws {
        let handler = TestHandler(begin: { _ in .buffer(limit: 4) })
        let server = try startServer(handler, polling) { $0.streamingPrefix = "/up/" }
        defer { server.shutDown(grace: .zero) }
        let client = try TestHTTPClient(port: server.port)

        try client.send("POST /up/small%21 HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\r\n12345")
        _ = try client.readResponse()
        try client.send("POST /up/fits HTTP/1.1\r\nHost: t\r\nContent-Length: 4\r\n\r\n1234")
        _ = try client.readResponse()
        try client.send("POST /other HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\r\n12345")
        _ = try client.readResponse()

        #expect(handler.begun.withLock { $0.map(\.path) } == ["/up/small!", "/up/fits"])
        let handled = handler.handled.withLock { $0 }
        try #require(handled.count == 3)
        #expect(handled[0].rawTarget == "/up/small%21" && handled[0].bodyTooLarge && handled[0].body.isEmpty)
        #expect(handled[1].rawTarget == "/up/fits" && !handled[1].bodyTooLarge && handled[1].body == Array("1234".utf8))
        #expect(handled[2].rawTarget == nil && !handled[2].bodyTooLarge && handled[2].body == Array("12345".utf8))
    }

    // MARK: - Streamed bodies

    @Test(arguments: Polling.allCases) func streamedAnswerIsSentAsItsProducerWritesIt(_ polling: Polling) async throws {
        let stream = HTTPResponseStream(onDrained: {})
        let handler = TestHandler { _ in .response(HTTPResponse(status: 200, headers: [], stream: stream, length: nil))
        }
        let server = try startServer(handler, polling)
        defer { server.shutDown(grace: .zero) }
        let client = try TestHTTPClient(port: server.port)

        try client.send("GET /stream HTTP/1.1\r\nHost: t\r\n\r\n")
        #expect(await eventually { handler.handled.withLock { $0.count } == 1 })
        // The server may already wait for bytes, its connection suspended: each write resumes it.
        let producer = BackgroundWork {
            for piece in ["hello", " ", "world"] {
                _ = Array(piece.utf8).withUnsafeBytes { stream.write($0) }
            }
            stream.finish()
        }
        let response = try client.readResponse()

        #expect(response.status == 200 && response.text == "hello world")
        #expect(response.header("Transfer-Encoding")?.lowercased() == "chunked")
        #expect(await eventually { producer.isDone })
    }

    /// A streamed answer whose producer failed before libmicrohttpd first asked it for bytes (a
    /// proxied upstream that sent its head, then broke off while the request body was still
    /// coming in) is cut at once: the client gets the head, then the connection's end, rather
    /// than waiting for a body that will never come until libmicrohttpd's connection timeout.
    @Test(arguments: Polling.allCases) func streamedAnswerThatFailedBeforeItsFirstReadIsCutAtOnce(_ polling: Polling)
        throws
    {
        let stream = HTTPResponseStream(onDrained: {})
        stream.finish(failed: true)
        let handler = TestHandler { _ in .response(HTTPResponse(status: 403, headers: [], stream: stream, length: 20)) }
        let server = try startServer(handler, polling)
        defer { server.shutDown(grace: .zero) }
        let client = try TestHTTPClient(port: server.port, timeoutSeconds: 3)

        try client.send("GET /cut HTTP/1.1\r\nHost: t\r\n\r\n")
        let head = try client.readHead()

        #expect(head.status == 403 && head.header("Content-Length") == "20")
        // Within the client's 3 s read timeout, long before the server's 30 s connection timeout.
        #expect(client.isClosedByServer(), "the connection ends instead of staying open without a body")
    }

    @Test(arguments: Polling.allCases) func streamedRequestBodyReachesItsConsumerWholeThroughPauses(_ polling: Polling)
        async throws
    {
        // Larger than a stream holds before its producer pauses, so the upload is suspended and resumed.
        let size = 3 * StreamLimits.highWater + 12_345
        let sent = (0..<size).map { UInt8(truncatingIfNeeded: $0 &* 31) }
        let handler = TestHandler(
            answer: { request in
                guard let body = request.bodyStream else { return .response(TestHandler.text(500, "no stream")) }
                return .deferred { responder in
                    _ = BackgroundWork { responder.respond(Self.consume(body)) }
                }
            }, begin: { _ in .stream(HTTPRequestBodyStream(limit: 4 * 1024 * 1024)) })
        let server = try startServer(handler, polling) { $0.streamingPrefix = "/up/" }
        defer { server.shutDown(grace: .zero) }
        let client = try TestHTTPClient(port: server.port)

        try client.send("POST /up/load HTTP/1.1\r\nHost: t\r\nContent-Length: \(size)\r\n\r\n")
        try client.send(sent)
        let response = try client.readResponse()

        #expect(response.status == 200)
        #expect(response.text == "\(size) bytes, sum \(sent.reduce(0) { $0 &+ Int($1) &* 7 })")
    }

    /// Reads a streamed request body to its end, waiting politely (bounded) when it is behind, and
    /// answers with its length and a checksum.
    private static func consume(_ body: HTTPRequestBodyStream) -> HTTPResponse {
        var buffer = [UInt8](repeating: 0, count: 16 * 1024)
        var count = 0
        var sum = 0
        for _ in 0..<20_000 {
            switch buffer.withUnsafeMutableBytes({ body.read(into: $0) }) {
            case .bytes(let n):
                count += n
                sum = buffer[..<n].reduce(sum) { $0 &+ Int($1) &* 7 }
            case .wait:
                usleep(1_000)
            case .end:
                return TestHandler.text(200, "\(count) bytes, sum \(sum)")
            case .tooLarge:
                return TestHandler.text(413, "too large")
            }
        }
        body.close()
        return TestHandler.text(500, "the body did not end")
    }

    // MARK: - Response headers

    @Test(arguments: Polling.allCases) func responseHeadersWithABadNameOrAControlCharacterAreDroppedAndCounted(
        _ polling: Polling
    ) throws {
        let before = HTTPResponse.droppedHeaders
        let answer = HTTPResponse(
            status: 200, body: Array("ok".utf8),
            headers: [
                ("X-Good", "1"), ("Bad Name", "x"), ("X-Ctl", "a\u{1}b"), ("X-Split", "a\r\nX-Injected: 1"),
                ("", "empty"), ("X-Tab", "a\tb"), ("X-Last", "2"),
            ])
        // Other suites may drop headers at the same time: the count grows by at least these four.
        #expect(HTTPResponse.droppedHeaders - before >= 4)
        #expect(answer.headers.count == 7, "the headers stay readable as given")
        let response = try sent(answer, polling)

        #expect(response.status == 200 && response.text == "ok")
        #expect(
            response.header("X-Good") == "1" && response.header("X-Tab") == "a\tb" && response.header("X-Last") == "2")
        let names = Set(response.headers.map { $0.0.lowercased() })
        #expect(names.isDisjoint(with: ["bad name", "x-ctl", "x-split", "x-injected", ""]))
        #expect(!response.headers.contains { $0.1 == "empty" })
    }

    /// What a client reads of `answer`, given to every request by a server polling as said.
    private func sent(_ answer: HTTPResponse, _ polling: Polling) throws -> TestHTTPClient.Response {
        let server = try startServer(TestHandler { _ in .response(answer) }, polling)
        defer { server.shutDown(grace: .zero) }
        let client = try TestHTTPClient(port: server.port)
        try client.send("GET / HTTP/1.1\r\nHost: t\r\n\r\n")
        return try client.readResponse()
    }

    /// A proxied answer's values are sent as the bytes that came (obs-text, RFC 9110 §5.5), and
    /// checked as text values are: a control byte drops the header, and is counted.
    @Test(arguments: Polling.allCases) func rawHeaderValuesAreSentAsTheirBytes(_ polling: Polling) throws {
        let before = HTTPResponse.droppedHeaders
        let obsText: [UInt8] = Array("caf".utf8) + [0xE9, 0x20, 0xFF]
        let answer = HTTPResponse(
            status: 200, body: Array("ok".utf8),
            rawHeaders: [
                ("X-Obs", obsText), ("X-Nul", [0x61, 0x00, 0x62]), ("X-Del", [0x61, 0x7F]),
                ("X-Split", Array("a\r\nX-Injected: 1".utf8)), ("X-Empty", []), ("X-Last", Array("2".utf8)),
            ])
        #expect(HTTPResponse.droppedHeaders - before >= 3)
        #expect(answer.rawHeaders.first?.1 == obsText, "kept as given")
        let response = try sent(answer, polling)

        let lines = response.head.split(separator: Array("\r\n".utf8)).map { Array($0) }
        #expect(lines.contains(Array("X-Obs: ".utf8) + obsText), "\(lines)")
        #expect(lines.contains(Array("X-Last: 2".utf8)))
        #expect(response.header("X-Empty") == "", "an empty value is sent (as a space, which is no part of it)")
        let names = Set(response.headers.map { $0.0.lowercased() })
        #expect(names.isDisjoint(with: ["x-nul", "x-del", "x-split", "x-injected"]))
    }
}
