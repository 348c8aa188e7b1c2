import TokenBrokerCore
import TokenBrokerServer

/// What the token listener needs from proxy mode (`TokenBrokerProxy`): the routes under
/// `/proxy/{name}/`. The listener checks the target, the request guard and the caller first.
public protocol ProxyHandling: Sendable {
    /// The provider whose token the named proxy adds; nil when no proxy has this name.
    func provider(ofProxy name: String) -> String?
    /// The request's headers have arrived: how to take its body.
    func begin(_ request: HTTPRequest, target: ProxyPath.Target) -> BodyHandling
    /// Forward the request (its body read whole, or flowing in through `request.bodyStream`).
    func handle(_ request: HTTPRequest, target: ProxyPath.Target) -> HTTPReply
}

extension TokenAPI {
    /// `begin` for targets under `/proxy/`: refuse what may not pass before any body is read.
    /// The server calls it for every such request before `handle`, so admission happens here only.
    public func begin(_ request: HTTPRequest) -> BodyHandling {
        switch proxyTarget(request, admitting: true) {
        case .pass(let target, let proxy): return proxy.begin(request, target: target)
        case .refuse(let refusal):
            proxyCounter.record(status: refusal.status)
            return .refuse(refusal)
        }
    }

    /// A proxied request, after `begin` admitted it: the guard and the caller's key are not checked twice.
    func proxied(_ request: HTTPRequest) -> HTTPReply {
        switch proxyTarget(request, admitting: false) {
        case .pass(let target, let proxy): return proxy.handle(request, target: target)
        case .refuse(let refusal): return record(proxyCounter, .response(refusal))
        }
    }

    /// The checked target and the proxy, or the refusal: a malformed or escaping path, an
    /// unknown proxy, the request guard, the caller check.
    private enum Admission {
        case pass(ProxyPath.Target, any ProxyHandling)
        case refuse(HTTPResponse)
    }

    private func proxyTarget(_ request: HTTPRequest, admitting: Bool) -> Admission {
        guard let raw = request.rawTarget else { return .refuse(Responses.notFound(request.path)) }
        let target: ProxyPath.Target
        switch ProxyPath.parse(raw) {
        case .success(let parsed): target = parsed
        case .failure(.absoluteForm): return .refuse(Responses.absoluteForm)
        case .failure(.notUnderProxy): return .refuse(Responses.notFound(request.path))
        case .failure(.badCharacters):
            return .refuse(.error(400, "invalid_request", "the path or query has characters that are not allowed raw (RFC 3986), or a bad percent-escape"))
        case .failure(.escapesRoot):
            return .refuse(.error(400, "invalid_request", "the path climbs above the proxy's base path"))
        case .failure(.encodedSeparator):
            return .refuse(.error(400, "invalid_request", "a path segment hides a slash, backslash, NUL, CR or LF in a percent-escape"))
        }
        guard let proxy, let provider = proxy.provider(ofProxy: target.proxy) else {
            return .refuse(.error(404, "unknown_proxy", "no proxy is named \(JSONText.quoted(String(target.proxy.prefix(64))))"))
        }
        if admitting, let refusal = admit(request, provider: provider) { return .refuse(refusal) }
        return .pass(target, proxy)
    }
}
