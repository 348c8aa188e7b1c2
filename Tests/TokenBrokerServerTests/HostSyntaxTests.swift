// Which `Host` values the request head check takes (RFC 9112 §3.2, RFC 3986 §3.2.2).
import Testing

@testable import TokenBrokerServer

@Suite struct HostSyntaxTests {
    private func isHost(_ value: String) -> Bool {
        Array(value.utf8).withUnsafeBytes { HTTPSyntax.isHost($0) }
    }

    @Test func hostsAndPortsAreTaken() {
        for value in [
            "", "x", "localhost", "localhost:", "127.0.0.1:8080", "[::1]", "[::1]:80", "[v1.fe80::a+en1]",
            "[fe80::1%25eth0]:8080",
            "metadata.google.internal", "a%41b:1", "sub-delims!$&'()*+,;=", "x:80 ", "x\t",
        ] {
            #expect(isHost(value), "\(value)")
        }
    }

    @Test func anythingElseIsRefused() {
        for value in [
            "a b/c@d", "x/y", "user@x", "x?y", "x#y", "x:80a", "x:-1", "x:80:81", "[::1", "[]", "[::1]x", "[::1]:8a",
            "[::1/64]", "a%2", "a%zz", "[fe80::1%eth0]", "[::1%2]", "a\"b", "a<b", "é.example", " x:80 y",
        ] {
            #expect(!isHost(value), "\(value)")
        }
    }
}
