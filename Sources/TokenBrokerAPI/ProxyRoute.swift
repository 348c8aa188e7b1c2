import TokenBrokerCore
import TokenBrokerServer

/// What the token listener needs from proxy mode (`TokenBrokerProxy`): the routes under
/// `/proxy/{name}/`. The listener checks the target, the request guard and the caller first.
public protocol ProxyHandling: Sendable {
    /// The request target as sent, split and checked by proxy mode's rules (no open proxy).
    func target(_ rawTarget: String) -> Result<ProxyRequestTarget, ProxyPathProblem>
    /// The provider whose token the named proxy adds; nil when no proxy has this name.
    func provider(ofProxy name: String) -> String?
    /// The request's headers have arrived: how to take its body.
    func begin(_ request: HTTPRequest, target: ProxyRequestTarget) -> BodyHandling
    /// Forward the request (its body read whole, or flowing in through `request.bodyStream`).
    /// - Parameter caller: the caller let in, when callers have keys: asked again before the
    ///   request goes upstream, and before an answer given after a wait, since the keys file may
    ///   have been re-read meanwhile.
    func handle(_ request: HTTPRequest, target: ProxyRequestTarget, caller: CallerRecheck?) -> HTTPReply
}

/// What `begin` leaves in `request.admitted` for `handle`: the checked target, the provider the
/// caller was checked for, and the caller let in (nil: callers have no keys).
struct ProxyAdmission: Sendable {
    let target: ProxyRequestTarget
    let provider: String
    let caller: CallerRecheck?
}

extension TokenAPI {
    /// `begin` for targets under `/proxy/`: refuse what may not pass before any body is read.
    /// The server calls it for every such request before `handle`, so admission happens here only;
    /// the checked target and the caller are left in `request.admitted` for `handle`.
    /// Without proxies the server streams no prefix and never calls it; the body is then read whole.
    @_specialize(where Provider == TokenProvider<ContinuousClock>)
    public func begin(_ request: inout HTTPRequest) -> BodyHandling {
        guard let proxy else { return .buffer(limit: nil) }
        guard let raw = request.rawTarget else {
            // The server hands requests under its streaming prefix over with their raw target.
            proxyCounter.record(status: 404)
            return .refuse(ErrorAnswer.notFound(path: request.path).response)
        }
        switch proxyTarget(request, raw: raw, proxy: proxy, admitting: true) {
        case .pass(let admission):
            request.admitted = admission
            return proxy.begin(request, target: admission.target)
        case .refuse(let refusal):
            let response = refusal.response
            proxyCounter.record(status: response.status)
            return .refuse(response)
        }
    }

    /// A proxied request, after `begin` admitted it: the guard and the caller's key are not checked twice.
    /// Reached only with proxies configured (`proxy` is not nil), so every `/proxy/{name}/` is
    /// either a proxy's or an `unknown_proxy`. Its exchange holds one of the caller's waiting
    /// places (`deferred(caller:label:_:)`) until its answer begins.
    func proxied(_ request: HTTPRequest, target raw: String, proxy: any ProxyHandling) -> HTTPReply {
        let admission: Admission
        // Checked by `begin`; unless a reload since removed its proxy or gave it another
        // provider, and then it is checked again: the caller, against the proxy's provider now.
        if let admitted = request.admitted as? ProxyAdmission,
            proxy.provider(ofProxy: admitted.target.proxy) == admitted.provider
        {
            admission = .pass(admitted)
        } else {
            admission = proxyTarget(request, raw: raw, proxy: proxy, admitting: request.admitted != nil)
        }
        switch admission {
        case .pass(let admitted):
            let reply = proxy.handle(request, target: admitted.target, caller: admitted.caller)
            guard case .deferred(let start) = reply else { return reply }
            let (metrics, body, name) = (metrics, request.bodyStream, admitted.target.proxy)
            let refused: @Sendable (HTTPResponse) -> Void = { response in
                metrics.recordProxied(proxy: name, status: response.status)
                // The exchange that would read the body never starts: the rest is dropped as it comes.
                body?.close()
            }
            return deferred(caller: admitted.caller?.caller, label: proxyCounter, refused: refused, start)
        case .refuse(let refusal): return record(proxyCounter, .response(refusal.response))
        }
    }

    /// The checked target, or the refusal: a malformed or escaping path, an unknown proxy, the
    /// request guard, the caller check.
    private enum Admission {
        case pass(ProxyAdmission)
        case refuse(ErrorAnswer)
    }

    /// What `begin` leaves in `request.admitted` for `handle`.
    private struct AdmittedProxyRequest: Sendable {
        let target: ProxyRequestTarget
        let caller: AdmittedCaller?
    }

    /// Without any proxy configured, `/proxy/{name}/…` is answered as for a name no proxy has
    /// (`proxyTarget`): the caller first (401 without a key, 403 without the guard's header),
    /// then 404 `unknown_proxy`; nil for a path that is not of that form.
    func proxyNotConfigured(_ request: HTTPRequest) -> HTTPResponse? {
        let prefix = "/proxy/"
        guard request.path.hasPrefix(prefix) else { return nil }
        let tail = request.path.dropFirst(prefix.count)
        let name = tail.prefix { $0 != "/" }
        guard !name.isEmpty, name.endIndex < tail.endIndex else { return nil }
        if let refusal = admit(request, provider: ""), !refusal.isProviderNotAllowed { return refusal.response }
        return ErrorAnswer.unknownProxy(name: String(name)).response
    }

    private func proxyTarget(_ request: HTTPRequest, raw: String, proxy: any ProxyHandling, admitting: Bool)
        -> Admission
    {
        let target: ProxyRequestTarget
        switch proxy.target(raw) {
        case .success(let parsed): target = parsed
        case .failure(.absoluteForm): return .refuse(.absoluteForm)
        case .failure(.notUnderProxy): return .refuse(.notFound(path: request.path))
        case .failure(let problem): return .refuse(.invalidProxyPath(problem))
        }
        guard let provider = proxy.provider(ofProxy: target.proxy) else {
            // The caller first, as for a proxy that exists: without the guard's header or a known
            // key, a name's existence is not told. Any known caller may learn it (a proxy
            // names no provider to check the caller against).
            if admitting, let refusal = admit(request, provider: ""), !refusal.isProviderNotAllowed {
                return .refuse(refusal)
            }
            return .refuse(.unknownProxy(name: target.proxy))
        }
        var caller: AdmittedCaller?
        if admitting, let refusal = admit(request, provider: provider, caller: &caller) { return .refuse(refusal) }
        return .pass(
            ProxyAdmission(
                target: target, provider: provider,
                caller: caller.flatMap { caller in callers.map { CallerRecheck(caller, by: $0) } }))
    }
}
